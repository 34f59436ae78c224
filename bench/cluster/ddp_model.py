#!/usr/bin/python3
"""ddp_model.py - real DistributedDataParallel steps of a model with
resnet50's parameters, over the backend "unisum", over gloo, and over gloo
with unisum's communication hook, in one job.

    unisum launch ... -- ddp_model.py --compute-ms MS --iters I --warmup K
                         [--model resnet50] [--bucket-mib 25]
                         [--variants unisum,gloo,hook]

Run under `unisum launch` (on netns.sh's hosts: bench/cluster/ddp), which
exports torchrun's variables; the default group is "unisum", and a gloo
group of every rank (GLOO_SOCKET_IFNAME=eth0) serves the other variants.

The model holds one parameter per parameter of torchvision's MODEL, of the
same shape (resnet50: 161 tensors, 25.6M floats), chained so that backward
reaches them in reverse order, as a network's backward does.  Compute is a
sleep (it stands for a GPU): forward sleeps MS/3; backward sleeps 2 MS/3,
shared among the parameters by size, each share before that parameter's
gradient is ready, so DDP's reducer starts each bucket's all-reduce as
its last gradient lands (DDP's own buckets, --bucket-mib).  A step is
forward, backward (which returns once DDP has every bucket's average) and
nothing else; every rank times it, and the slowest rank's time counts.

Rank 0 prints, per variant:

    ddp variant=V world=W params=N median_s=.. mean_s=.. iters=I

Gradients are checked: after the last step of each variant, every rank's
first gradient element must equal the average of every rank's.
"""
import argparse
import datetime
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn


class _Sleep(torch.autograd.Function):
    """Identity whose backward sleeps `s` seconds first."""

    @staticmethod
    def forward(ctx, h, s):
        ctx.s = s
        return h.clone()

    @staticmethod
    def backward(ctx, g):
        time.sleep(ctx.s)
        return g, None


class Replay(nn.Module):
    def __init__(self, shapes, bwd_s):
        super().__init__()
        self.ps = nn.ParameterList([nn.Parameter(torch.zeros(s)) for s in shapes])
        total = sum(p.numel() for p in self.ps)
        self.sleeps = [bwd_s * p.numel() / total for p in self.ps]

    def forward(self, x):
        h = x
        for p, s in zip(self.ps, self.sleeps):
            # d(out)/d(p[0]) = x: every gradient element 0 is the input.
            h = _Sleep.apply(h + p.view(-1)[0] * x, s)
        return h


def shapes_of(model):
    import torchvision
    return [tuple(p.shape) for p in getattr(torchvision.models, model)().parameters()]


def run(variant, a, rank, world, gloo):
    from unisum.torch import ddp_hooks
    torch.manual_seed(0)
    net = Replay(a.shapes, a.compute_ms * 2 / 3 / 1e3)
    group = None if variant == "unisum" else gloo
    ddp = nn.parallel.DistributedDataParallel(net, process_group=group,
                                              bucket_cap_mb=a.bucket_mib)
    if variant == "hook":
        ddp.register_comm_hook(ddp_hooks.State(prefix="bench"), ddp_hooks.push_pull_hook)
    x = torch.full((1,), float(rank + 1))
    times = []
    for k in range(a.warmup + a.iters):
        dist.barrier(group=gloo)
        t0 = time.monotonic()
        time.sleep(a.compute_ms / 3 / 1e3)
        ddp(x).sum().backward()
        dt = torch.tensor([time.monotonic() - t0])
        dist.all_reduce(dt, op=dist.ReduceOp.MAX, group=gloo)
        if k >= a.warmup:
            times.append(dt.item())
        if k + 1 < a.warmup + a.iters:
            for p in net.ps:
                p.grad = None
    want = (world + 1) / 2
    bad = [i for i, p in enumerate(net.ps) if abs(p.grad.view(-1)[0].item() - want) > 1e-6]
    if bad:
        sys.exit("ddp_model: rank %d, %s: %d gradient(s) not the average (want %g)"
                 % (rank, variant, len(bad), want))
    if rank == 0:
        print("ddp variant=%s world=%d params=%d median_s=%.4f mean_s=%.4f iters=%d"
              % (variant, world, sum(p.numel() for p in net.ps), statistics.median(times),
                 statistics.mean(times), a.iters), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--compute-ms", type=float, required=True)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--bucket-mib", type=float, default=25.0)
    ap.add_argument("--variants", default="unisum,gloo,hook")
    a = ap.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "eth0")
    import unisum.torch.distributed  # noqa: F401  (registers "unisum")
    dist.init_process_group("unisum", timeout=datetime.timedelta(seconds=600))
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(list(range(world)), backend="gloo")
    a.shapes = shapes_of(a.model)
    for variant in a.variants.split(","):
        run(variant, a, rank, world, gloo)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
