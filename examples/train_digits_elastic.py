"""Elastic data-parallel training of the digits CNN, Horovod-elastic style.

    build/unisum launch -w 4 -s 2 --elastic --min-workers 2 --max-workers 5 \\
        --host-discovery-script ./hosts.sh -- /usr/bin/python3 \\
        examples/train_digits_elastic.py

The model, optimizer, epoch, batch and an ElasticSampler live in a
``unisum.torch.elastic.TorchState``; the state is committed every
``--commit-every`` steps.  When a worker is lost, the others roll back to
the last commit, re-form at the new size and go on; a worker that starts
later (the discovery script offers another slot) enters at the next commit
and receives the state by broadcast.  Every worker's learning rate is
scaled by the current number of workers after each re-form.

Rank 0 prints each epoch's held-out accuracy, then

    final held-out accuracy: 0.9xxx
    elastic: N steps run, M kept, L lost to rollbacks, R re-forms

and every worker prints the digest of its parameters (every survivor's
must be the same).  --die-at S: the worker that started as rank
--die-rank kills itself (SIGKILL) before step S (tests).
"""

import argparse
import hashlib
import os
import signal
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "python"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import unisum.torch as us  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_digits import Net, digits_split  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--batch-size", type=int, default=32, help="per worker")
    ap.add_argument("--lr", type=float, default=0.02, help="per worker (times size)")
    ap.add_argument("--commit-every", type=int, default=10, help="steps between commits")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--die-at", type=int, default=-1, help="tests: the step to die before")
    ap.add_argument("--die-rank", type=int, default=-1, help="tests: the first rank that dies")
    ap.add_argument("--step-ms", type=float, default=0.0,
                    help="tests: sleep this long every step (gives joiners time)")
    args = ap.parse_args()

    torch.set_num_threads(1)
    us.init()
    first_rank = us.rank()
    torch.manual_seed(args.seed + first_rank)    # different on purpose: sync fixes it
    x_train, y_train, x_test, y_test = digits_split()

    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * us.size(), momentum=0.9)
    optimizer = us.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    sampler = us.elastic.ElasticSampler(range(len(x_train)), shuffle=True, seed=args.seed)
    state = us.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0, step=0)
    counts = {"run": 0, "reforms": 0}

    def on_reset():
        counts["reforms"] += 1
        for group in optimizer.param_groups:
            group["lr"] = args.lr * us.size()
        print("re-formed: rank %d of %d" % (us.rank(), us.size()), flush=True)

    state.register_reset_callbacks([on_reset])

    @us.elastic.run
    def train(state):
        accuracy = 0.0
        while state.epoch < args.epochs:
            if state.batch == 0:
                state.sampler.set_epoch(state.epoch)
            indices = list(state.sampler)
            steps = (len(indices) + args.batch_size - 1) // args.batch_size
            model.train()
            while state.batch < steps:
                if state.step == args.die_at and first_rank == args.die_rank:
                    os.kill(os.getpid(), signal.SIGKILL)
                if args.step_ms > 0:
                    import time
                    time.sleep(args.step_ms / 1000.0)
                idx = torch.tensor(state.sampler.get_indices(state.batch, args.batch_size))
                optimizer.zero_grad()
                loss = F.cross_entropy(model(x_train[idx]), y_train[idx])
                loss.backward()
                optimizer.step()
                counts["run"] += 1
                state.sampler.record_batch(state.batch, args.batch_size)
                state.batch += 1
                state.step += 1
                if state.step % args.commit_every == 0:
                    state.commit()
            model.eval()
            with torch.no_grad():
                accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
            if us.rank() == 0:
                print("epoch %2d  %d workers  held-out accuracy %.4f"
                      % (state.epoch + 1, us.size(), accuracy), flush=True)
            state.epoch += 1
            state.batch = 0
            state.commit()
        return accuracy

    accuracy = train(state)
    digest = hashlib.sha256()
    for t in model.state_dict().values():
        digest.update(t.detach().contiguous().numpy().tobytes())
    print("rank %d of %d (started as %d): parameters %s" % (us.rank(), us.size(), first_rank,
                                                           digest.hexdigest()[:16]), flush=True)
    if us.rank() == 0:
        print("final held-out accuracy: %.4f" % accuracy, flush=True)
        print("elastic: %d steps run, %d kept, %d lost to rollbacks, %d re-forms"
              % (counts["run"], state.step, counts["run"] - state.step, counts["reforms"]),
              flush=True)
    us.shutdown()


if __name__ == "__main__":
    main()
