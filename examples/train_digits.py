"""Data-parallel training of a small CNN on scikit-learn's digits with unisum.

    build/unisum launch -w 4 -s 2 --local-size 2 -- /usr/bin/python3 \
        examples/train_digits.py --lr 0.06

(`make demo` runs exactly that: 2 machines of 2 workers, 2 servers.)  Every
worker trains on its own shard of
the training set; DistributedOptimizer sums the gradients of all workers
as backward() produces them, so every worker holds the same model after
every step.  Rank 0 shows a progress bar, the loss and the held-out
accuracy of every epoch, and finally prints

    final held-out accuracy: 0.9xxx

and a report of where the bytes went: summed in shared memory within
machines, and pushed to each server against its Theorem 1 share
(unisum.torch.get_stats() of every worker).

--hidden widens the classifier (default 64; 8192 makes 4.3 M parameters,
17 MiB per step: bench/cluster/sync).  --sync picks the synchronisation (default: UNISUM_SYNC, else lock-step):
sync, async (the servers hold the model and add each worker's change as it
comes), ssp:S (async, no worker more than S steps ahead) or dssync:G
(models averaged within groups of G workers that change every step, and
over all every UNISUM_DSSYNC_GLOBAL_EVERY steps and at the end).

--compressor compresses the gradients the BytePS way (DistributedOptimizer's
compression_params): a compressor and BytePS's keys, e.g.
"onebit,ef=vanilla,momentum=nesterov" or "topk,k=0.01,ef=vanilla"; with
momentum=nesterov the momentum moves from SGD into the compressor, which is
meant for UNISUM_MIN_COMPRESS_BYTES=0 (every gradient compressed: the
smaller ones would otherwise have no momentum at all).  Only gradients of
64 KiB and more are compressed by default (here fc1.weight).  With --ddp, --powersgd R adds PyTorch's PowerSGD comm hook of rank R,
the peer of compression.

The digits data set ships inside python3-sklearn: nothing is downloaded.
It is read straight from the package's data file when it is there, as
`load_digits` reads it, without importing scikit-learn (0.85 CPU-s a
worker here).
"""

import argparse
import gzip
import importlib.util
import os
import sys
import time

# Usable straight from a source checkout, without installing the package.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "python"))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from tqdm import tqdm  # noqa: E402

import unisum.torch as us  # noqa: E402


class Net(nn.Module):
    """Two small convolutions and a classifier for 8x8 images."""

    def __init__(self, hidden=64):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, hidden)
        self.fc2 = nn.Linear(hidden, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--batch-size", type=int, default=32, help="per worker")
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--compression", choices=["none", "fp16"], default="none")
    ap.add_argument("--compressor", default=None, metavar="NAME[,KEY=VALUE...]",
                    help="BytePS compression of the gradients, e.g. onebit,ef=vanilla,"
                         "momentum=nesterov (DistributedOptimizer's compression_params)")
    ap.add_argument("--powersgd", type=int, default=0, metavar="RANK",
                    help="with --ddp: PowerSGD's comm hook of this rank (0: none)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--hidden", type=int, default=64,
                    help="width of the classifier's hidden layer (a wider one makes the model, "
                         "and what each step sends, larger: bench/cluster/sync)")
    ap.add_argument("--sync", default=None,
                    help="sync, async, ssp:S or dssync:G (default: UNISUM_SYNC, else sync)")
    ap.add_argument("--ddp", metavar="RANK:WORLD:ADDR:PORT", default=None,
                    help="train with PyTorch DistributedDataParallel on gloo instead, the "
                         "peer of bench/cluster/sync (one process per rank, rank 0's store "
                         "at ADDR:PORT)")
    args = ap.parse_args()

    if args.ddp:
        return main_ddp(args)
    us.init()
    rank, size = us.rank(), us.size()
    torch.manual_seed(args.seed + rank)    # different on purpose: broadcast fixes it
    model = Net(args.hidden)
    params = None
    if args.compressor:
        words = args.compressor.split(",")
        params = dict(w.split("=", 1) for w in words[1:])
        params["compressor"] = words[0]
    # Nesterov momentum in the compressor replaces SGD's (BytePS's way).
    momentum = 0.0 if params and params.get("momentum") == "nesterov" else 0.9
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=momentum)
    compression = us.Compression.fp16 if args.compression == "fp16" else us.Compression.none
    optimizer = us.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                        compression=compression, sync=args.sync,
                                        compression_params=params)
    us.broadcast_parameters(model.state_dict(), root_rank=0)
    us.broadcast_optimizer_state(optimizer, root_rank=0)
    sum_all = lambda t, name: us.push_pull(t, average=False, name=name)  # noqa: E731
    steps, seconds = train(args, rank, size, model, optimizer,
                           "compression %s, sync %s" % (
                               args.compressor or args.compression,
                               args.sync or os.environ.get("UNISUM_SYNC") or "sync"),
                           sum_all,
                           optimizer.global_average)   # dssync: every replica the same at the end
    report(rank, size, steps, seconds, sum_all)
    us.shutdown()


def report(rank, size, steps, seconds, sum_all):
    """Rank 0 says where the job's bytes went, from every worker's
    unisum.torch.get_stats(): summed in shared memory within machines, and
    pushed to each server, against each server's share by Theorem 1."""
    st = us.get_stats()
    servers = len(st["server_bytes"])
    mine = torch.tensor([st["local_bytes"], st["bytes_pushed"]] + st["server_bytes"],
                        dtype=torch.float64)
    total = sum_all(mine, "report.bytes").tolist()
    if rank != 0:
        return
    machines = size // us.local_size()
    mib = 1 << 20
    print("report: %d steps, %.1f ms a step; %d machine(s) of %d worker(s), %d server(s)"
          % (steps, 1000.0 * seconds / max(steps, 1), machines, us.local_size(), servers))
    print("  summed in shared memory within machines: %.1f MiB" % (total[0] / mib))
    pushed = total[1]
    shares = ", ".join("server %d %.1f%%" % (s, 100.0 * total[2 + s] / pushed if pushed else 0)
                       for s in range(servers))
    if servers == machines:
        # One server per machine, beside its workers (make demo, unisum
        # launch -H or --slurm without CPU-only servers): all colocated,
        # k = 0, and Theorem 1 gives each the same share.
        theorem = "Theorem 1: %.1f%% each, every server colocated" % (100.0 / servers)
    else:
        theorem = "Theorem 1's shares: UNISUM_LOG_LEVEL=INFO has the scheduler log them"
    print("  pushed to the servers: %.1f MiB (%s; %s)" % (pushed / mib, shares, theorem))
    if os.environ.get("UNISUM_TRACE_ON", os.environ.get("BYTEPS_TRACE_ON", "0")) == "1":
        print("  timeline: %s/<rank>/comm.json" % os.environ.get(
            "UNISUM_TRACE_DIR", os.environ.get("BYTEPS_TRACE_DIR", "trace")))
    else:
        print("  timeline: off (UNISUM_TRACE_ON=1 writes one per rank to UNISUM_TRACE_DIR)")


def load_digits_arrays():
    """The 1,797 8x8 digit images and their labels, as numpy arrays: from
    sklearn's digits.csv.gz (64 pixels, then the label, a row each, which
    is all `load_digits` reads), else through `load_digits` itself."""
    spec = importlib.util.find_spec("sklearn")    # finds it, imports nothing
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(folder, "datasets", "data", "digits.csv.gz")
        if os.path.exists(path):
            import numpy as np
            with gzip.open(path) as f:
                data = np.loadtxt(f, delimiter=",")
            return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)
    from sklearn.datasets import load_digits
    digits = load_digits()
    return digits.images, digits.target


def digits_split():
    """The digits as tensors, shuffled the same way on every worker: the
    training images and labels, then the held-out fifth's."""
    images, target = load_digits_arrays()
    x = torch.tensor(images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(target, dtype=torch.int64)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    x, y = x[perm], y[perm]
    n_test = len(x) // 5
    return x[n_test:], y[n_test:], x[:n_test], y[:n_test]


def train(args, rank, size, model, optimizer, how, sum_all, at_last_epoch=None):
    """The training loop, on this rank's shard: `sum_all(tensor, name)`
    sums a tensor over all ranks; `at_last_epoch` runs before the last
    evaluation."""
    torch.set_num_threads(1)
    x_train, y_train, x_test, y_test = digits_split()
    n_train, n_test = len(x_train), len(x_test)
    x_train, y_train = x_train[rank::size], y_train[rank::size]   # this worker's shard

    if rank == 0:
        print("digits: %d training images in %d shards, %d held out, %d worker(s), %s"
              % (n_train, size, n_test, size, how), flush=True)
    steps = (len(x_train) + args.batch_size - 1) // args.batch_size
    # Every worker must take the same number of steps.
    steps = int(sum_all(torch.tensor([steps], dtype=torch.int64), "steps").item()) // size
    accuracy = 0.0
    started = time.monotonic()
    for epoch in range(1, args.epochs + 1):
        model.train()
        order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(epoch))
        bar = tqdm(range(steps), desc="epoch %2d" % epoch, disable=rank != 0, leave=False,
                   file=sys.stdout, ncols=72)
        total = torch.zeros(2, dtype=torch.float64)
        for step in bar:
            idx = order[(step * args.batch_size) % len(x_train):][:args.batch_size]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x_train[idx]), y_train[idx])
            loss.backward()
            optimizer.step()
            total += torch.tensor([loss.item() * len(idx), len(idx)], dtype=torch.float64)
        total = sum_all(total, "epoch.loss")
        if epoch == args.epochs and at_last_epoch is not None:
            at_last_epoch()
        if rank == 0:
            # Rank 0's replica is the one reported; the others go on with
            # the next epoch rather than each evaluate for nobody.
            model.eval()
            with torch.no_grad():
                accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
            print("epoch %2d  loss %.4f  held-out accuracy %.4f"
                  % (epoch, (total[0] / total[1]).item(), accuracy), flush=True)
    if rank == 0:
        print("final held-out accuracy: %.4f" % accuracy, flush=True)
    return steps * args.epochs, time.monotonic() - started


def main_ddp(args):
    """The same training with DDP on gloo: the same data, shards, model,
    optimizer and steps; gradients averaged by gloo's ring all_reduce."""
    import datetime
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    rank, world, addr, port = args.ddp.split(":")
    rank, size = int(rank), int(world)
    dist.init_process_group("gloo", init_method="tcp://%s:%s" % (addr, port), rank=rank,
                            world_size=size, timeout=datetime.timedelta(seconds=600))
    torch.manual_seed(args.seed + rank)
    model = DistributedDataParallel(Net(args.hidden))   # broadcasts rank 0's parameters
    how = "DDP on gloo"
    if args.powersgd > 0:
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
        state = powerSGD_hook.PowerSGDState(process_group=None,
                                            matrix_approximation_rank=args.powersgd,
                                            start_powerSGD_iter=2)
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        how += ", PowerSGD rank %d" % args.powersgd
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    def sum_all(t, name):
        dist.all_reduce(t)
        return t

    steps, seconds = train(args, rank, size, model, optimizer, how, sum_all)
    if rank == 0:
        print("report: %d steps, %.1f ms a step" % (steps, 1000.0 * seconds / max(steps, 1)))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
