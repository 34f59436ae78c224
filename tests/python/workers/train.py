"""Worker: data-parallel training of common.make_mlp() with
unisum.torch.DistributedOptimizer, for SGD with momentum and for Adam.

    train.py OUTDIR [--passes K] [--steps S]

Every rank starts from the same seed and trains on its shard of each
step's global batch (common.shard).  With --passes K, each step runs K
backward passes over K equal pieces of the shard, each with the loss
scaled by 1/K (DistributedOptimizer(backward_passes_per_step=K) sums the
passes' gradients locally, as Horovod does), then one step().  Writes
OUTDIR/rank<r>.pt: {"size", "rank", "<kind>": [parameters after each step]}.
"""

import argparse

import torch

import common
import unisum.torch as us


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--passes", type=int, default=1)
    ap.add_argument("--steps", type=int, default=common.STEPS)
    ap.add_argument("--set-to-none", action="store_true",
                    help="zero_grad(set_to_none=True), PyTorch 2's default")
    args = ap.parse_args()
    torch.set_num_threads(1)

    us.init()
    rank, size = us.rank(), us.size()
    x, y = common.make_data(args.steps)
    result = {"rank": rank, "size": size}
    for kind in ("sgd", "adam"):
        model = common.make_mlp()
        opt = us.DistributedOptimizer(
            common.make_optimizer(kind, model.parameters()),
            # Distinct names per optimizer: both models live in one job.
            named_parameters=[(kind + "." + n, p) for n, p in model.named_parameters()],
            backward_passes_per_step=args.passes)
        history = []
        for step in range(args.steps):
            xs, ys = common.shard(x, y, step, rank, size)
            opt.zero_grad(set_to_none=True) if args.set_to_none else opt.zero_grad()
            for xp, yp in zip(xs.chunk(args.passes), ys.chunk(args.passes)):
                (common.loss_fn(model, xp, yp) / args.passes).backward()
            opt.step()
            history.append(common.snapshot(model))
        result[kind] = history
    common.save(args.outdir, rank, result)
    us.shutdown()


if __name__ == "__main__":
    main()
