#!/usr/bin/python3
"""ddp_replay.py - a training step the way PyTorch DDP runs it on gloo,
replayed across the hosts of netns.sh, against `unisum bench --model`.

    ddp_replay.py --rank R --world W --master ADDR:PORT --params N
                  --compute-ms MS --iters I --warmup K [--bucket-mib 25]
                  [--ifname eth0] [--timeout S]

One process of a W-process job (start one per emulated host with
`netns.sh exec`; rank 0 on ADDR serves the store).  The model is N float32
parameters (the count `unisum bench --model NAME --list` prints), cut into
DDP's gradient buckets of --bucket-mib (DistributedDataParallel's
bucket_cap_mb, 25 by default).  Each iteration, as `unisum bench --model`
does: a forward pass sleeps MS/3; a backward pass sleeps 2 MS/3, split
evenly over the buckets, and starts each bucket's all_reduce (gloo's ring,
async_op=True) as soon as its share of the backward has slept, as DDP's
reducer does when a bucket's last gradient is ready; the step ends when
every bucket's all_reduce has completed (DDP waits for them before the
optimizer runs).  Compute is a sleep: it stands for a GPU.

Rank 0 prints one line after I timed iterations (K warm-up ones first):

    ddp world=W params=N buckets=B median_s=.. mean_s=.. iters=I

Every element of every bucket holds rank + 1 before each all_reduce, so
the sum is W(W+1)/2 exactly; a few elements are checked after the last.
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gloo_ring import job_args, join  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    job_args(ap, timeout=600)
    ap.add_argument("--params", type=int, required=True, help="float32 parameters of the model")
    ap.add_argument("--compute-ms", type=float, required=True)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--bucket-mib", type=float, default=25.0)
    a = ap.parse_args()
    if a.params < 1 or a.warmup < 0 or a.compute_ms < 0 or a.bucket_mib <= 0:
        ap.error("need params >= 1, warmup >= 0, compute-ms >= 0, bucket-mib > 0")
    join(ap, a)
    per = max(1, int(a.bucket_mib * 1024 * 1024 / 4))
    sizes = [min(per, a.params - off) for off in range(0, a.params, per)]
    buckets = [torch.empty(n, dtype=torch.float32) for n in sizes]
    fwd_s = a.compute_ms / 3 / 1e3
    bwd_s = a.compute_ms * 2 / 3 / 1e3 / len(buckets)
    times = []
    for k in range(a.warmup + a.iters):
        for b in buckets:
            b.fill_(a.rank + 1)
        dist.barrier()
        t0 = time.monotonic()
        time.sleep(fwd_s)
        works = []
        for b in reversed(buckets):  # the last layers' bucket is ready first
            time.sleep(bwd_s)
            works.append(dist.all_reduce(b, async_op=True))
        for w in works:
            w.wait()
        if k >= a.warmup:
            times.append(time.monotonic() - t0)
    want = a.world * (a.world + 1) / 2
    bad = [i for i, b in enumerate(buckets) for j in (0, b.numel() - 1) if b[j].item() != want]
    if bad:
        print("ddp_replay: rank %d: bucket(s) %s hold a wrong sum (want %g)" % (a.rank, bad, want),
              file=sys.stderr)
    if a.rank == 0:
        print("ddp world=%d params=%d buckets=%d median_s=%.6f mean_s=%.6f iters=%d"
              % (a.world, a.params, len(buckets), statistics.median(times),
                 statistics.mean(times), a.iters), flush=True)
    dist.destroy_process_group()
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
