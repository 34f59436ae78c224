#!/usr/bin/python3
"""powersgd_replay.py - a training step of torchvision's resnet50 the way
PyTorch DDP runs it on gloo with the PowerSGD comm hook, replayed across
the hosts of netns.sh, against `unisum bench --model resnet50 --compressor`.

    powersgd_replay.py --rank R --world W --master ADDR:PORT --rank-approx N
                       --compute-ms MS --iters I --warmup K [--ifname eth0]

One process of a W-process job (start one per emulated host with
`netns.sh exec`).  The model has resnet50's parameters, with their shapes
(PowerSGD compresses each gradient as a matrix, its first dimension by the
rest): DistributedDataParallel over them in ONE bucket, and PowerSGD's
hook of rank N (error feedback and warm start on, as PyTorch's defaults;
compression from the second iteration, so every timed one is
compressed).  One bucket because on gloo the hook's collectives of two
buckets interleave in a different order on each rank (each bucket's
chain of all_reduces continues from gloo's completion callbacks while the
next bucket's hook starts its own), and gloo then pairs messages of
different sizes and aborts (torch 1.13: "op.preamble.length <= op.nbytes");
PowerSGD's traffic is small, so its overlap with the backward matters
little.  --rank-approx 0: plain DDP (25 MiB buckets) for comparison.  Each iteration, as `unisum bench --model` does: a forward
pass sleeps MS/3; the backward pass sleeps 2 MS/3 split evenly over the
parameters, last first, each gradient produced by an autograd function
that sleeps its share (so DDP's buckets become ready, and their hooks
run, while the rest of the backward still sleeps: the overlap DDP has);
the step ends when DDP's reducer has finished.  Compute is a sleep: it
stands for a GPU.

Rank 0 prints one line after I timed iterations (K warm-up ones first):

    powersgd world=W rank=N median_s=.. mean_s=.. iters=I
"""
import argparse
import datetime
import os
import statistics
import time

import torch
import torch.distributed as dist
import torchvision
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
from torch.nn.parallel import DistributedDataParallel


class SleepGrad(torch.autograd.Function):
    """Identity whose backward sleeps first: one parameter's share of the
    backward's compute."""

    @staticmethod
    def forward(ctx, x, seconds):
        ctx.seconds = seconds
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        time.sleep(ctx.seconds)
        return g, None


class Replay(torch.nn.Module):
    """resnet50's parameters; the loss touches each once (gradient 1e-3 x a
    fixed pattern), in forward order, so backward meets them last first."""

    def __init__(self, bwd_s):
        super().__init__()
        shapes = [p.shape for p in torchvision.models.resnet50().parameters()]
        self.params = torch.nn.ParameterList(torch.nn.Parameter(torch.zeros(s)) for s in shapes)
        self.bwd_s = bwd_s / len(shapes)

    def forward(self):
        loss = 0
        for p in self.params:
            loss = loss + SleepGrad.apply(p, self.bwd_s).sum() * 1e-3
        return loss


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--master", required=True)
    ap.add_argument("--rank-approx", type=int, required=True)
    ap.add_argument("--compute-ms", type=float, required=True)
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--ifname", default="eth0")
    a = ap.parse_args()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", a.ifname)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://" + a.master, rank=a.rank,
                            world_size=a.world, timeout=datetime.timedelta(seconds=900))
    fwd_s, bwd_s = a.compute_ms / 3e3, 2 * a.compute_ms / 3e3
    model = DistributedDataParallel(Replay(bwd_s),
                                    bucket_cap_mb=1024 if a.rank_approx > 0 else 25)
    state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=a.rank_approx,
                                        start_powerSGD_iter=2)
    if a.rank_approx > 0:
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    times = []
    for it in range(a.warmup + a.iters):
        t0 = time.monotonic()
        time.sleep(fwd_s)
        model.zero_grad(set_to_none=True)
        model().backward()      # DDP's reducer waits for every bucket's hook
        times.append(time.monotonic() - t0)
    timed = times[a.warmup:]
    if a.rank == 0:
        print("powersgd world=%d rank=%d median_s=%.4f mean_s=%.4f iters=%d"
              % (a.world, a.rank_approx, statistics.median(timed), statistics.mean(timed),
                 len(timed)), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
