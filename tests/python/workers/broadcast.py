"""Worker: broadcast_parameters / broadcast_optimizer_state make every rank
equal to the root.

    broadcast.py OUTDIR ROOT

Every rank builds its models from a different seed and its optimizers with
different hyperparameters; the root alone trains a few local steps first, so
it has optimizer state (momentum buffers, Adam's step and moments, BatchNorm
statistics) that the fresh ranks lack.  Three (model, optimizer) pairs:

  sgdm  SGD with momentum,     broadcast_parameters(model.state_dict())
  adam  Adam wrapped in DistributedOptimizer,
                               broadcast_parameters(model.named_parameters())
  sgd   SGD without momentum (stateless), broadcast_parameters(model.state_dict())

Writes OUTDIR/rank<r>.pt with, per pair, the model and optimizer state dicts
before and after the broadcasts, and the parameters after one more step taken
after the broadcast (the same local batch on every rank for sgdm/sgd, a
distributed step for adam).
"""

import copy
import sys

import torch
import torch.nn as nn

import common
import unisum.torch as us


def make_model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(common.IN, common.HIDDEN), nn.BatchNorm1d(common.HIDDEN),
                         nn.Tanh(), nn.Linear(common.HIDDEN, common.OUT))


def make_optimizer(kind, params, is_root):
    if kind == "sgdm":
        return torch.optim.SGD(params, lr=0.05 if is_root else 0.5,
                               momentum=0.9 if is_root else 0.3,
                               weight_decay=1e-3 if is_root else 0.0)
    if kind == "adam":
        return torch.optim.Adam(params, lr=0.01 if is_root else 0.2,
                                betas=(0.8, 0.95) if is_root else (0.5, 0.6),
                                eps=1e-7 if is_root else 1e-3)
    return torch.optim.SGD(params, lr=0.1 if is_root else 0.7)


def state(model, opt):
    return {"model": copy.deepcopy(model.state_dict()), "opt": copy.deepcopy(opt.state_dict())}


def main():
    outdir, root = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(1)
    us.init()
    rank, size = us.rank(), us.size()
    is_root = rank == root
    x, y = common.make_data(steps=4, seed=500)        # the same on every rank
    result = {"rank": rank, "size": size, "root": root}

    for kind in ("sgdm", "adam", "sgd"):
        model = make_model(seed=100 + 7 * rank)           # different on every rank
        opt = make_optimizer(kind, model.parameters(), is_root)
        if is_root:
            # Local steps (not distributed): only the root has state.
            for step in range(3):
                xb, yb = common.global_batch(x, y, step)
                opt.zero_grad()
                common.loss_fn(model, xb, yb).backward()
                opt.step()
        if kind == "adam":
            opt = us.DistributedOptimizer(
                opt, named_parameters=[("adam." + n, p) for n, p in model.named_parameters()])
        entry = {"before": state(model, opt)}

        if kind == "adam":
            us.broadcast_parameters(model.named_parameters(), root_rank=root)
        else:
            us.broadcast_parameters(model.state_dict(), root_rank=root)
        us.broadcast_optimizer_state(opt, root_rank=root)
        entry["after"] = state(model, opt)

        # One more step: the optimizer state must be in effect, not just stored.
        if kind == "adam":
            xb, yb = common.shard(x, y, 3, rank % 2, 2)   # differs between some ranks
        else:
            xb, yb = common.global_batch(x, y, 3)
        opt.zero_grad()
        common.loss_fn(model, xb, yb).backward()
        opt.step()
        entry["stepped"] = common.snapshot(model)
        result[kind] = entry

    common.save(outdir, rank, result)
    us.shutdown()


if __name__ == "__main__":
    main()
