"""Worker: a subclass of the optimizer class DistributedOptimizer() made
(as frameworks make of an optimizer they are given) steps and zeroes its
gradients without recursing, and trains as the class itself does.

    subclassed.py OUTDIR

Writes OUTDIR/rank<r>.pt: {"plain": [...], "sub": [...]}, the parameters
after each step of common.make_mlp() trained both ways.
"""

import sys

import torch

import common
import unisum.torch as us


def train(kind, rank, size, subclass):
    x, y = common.make_data(4)
    model = common.make_mlp()
    opt = us.DistributedOptimizer(common.make_optimizer("sgd", model.parameters()),
                                  named_parameters=[(kind + "." + n, p)
                                                    for n, p in model.named_parameters()])
    if subclass:
        opt.__class__ = type("Sub", (type(opt),), {"steps": 0})
    history = []
    for step in range(4):
        xs, ys = common.shard(x, y, step, rank, size)
        opt.zero_grad()
        common.loss_fn(model, xs, ys).backward()
        opt.step()
        history.append(common.snapshot(model))
    return history


def main():
    torch.set_num_threads(1)
    us.init()
    rank, size = us.rank(), us.size()
    common.save(sys.argv[1], rank, {"plain": train("plain", rank, size, False),
                                    "sub": train("sub", rank, size, True)})
    us.shutdown()


if __name__ == "__main__":
    main()
