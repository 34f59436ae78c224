#!/usr/bin/python3
"""gloo_allreduce.py - the PyTorch gloo peer of bench/local.sh.

    python3 gloo_allreduce.py PROCS BYTES ITERS WARMUP

Spawns PROCS processes (torch.multiprocessing) that join one gloo process
group on 127.0.0.1 (a free port, init through the environment), each with
torch.set_num_threads(1).  Every process runs float32 all_reduce(SUM) on
BYTES of its own; rank r fills element j with (j mod 251) + r, so every
sum is exact in float32.  all_reduce is in place, so the input is copied
back from a pristine tensor before each call, outside the timing.  Each
call is preceded by a barrier and timed on every rank; the time of a call
is the maximum over ranks (an all_reduce(MAX) of the times after the timed
call).  Rank 0 prints one line:

    gloo procs=P bytes=BYTES median_ms=.. min_ms=.. p99_ms=..

and a few elements of the last result are checked exactly (exit 1 when
wrong).
"""
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def timed_all_reduce(rank, world, nbytes, iters, warmup, who):
    """In an initialised gloo process group: WARMUP + ITERS float32
    all_reduce(SUM) calls on NBYTES, each after a barrier and a copy from the
    pristine input, timed as the slowest rank's (all_reduce(MAX) of the times).
    Checks a few elements of the last result exactly on every rank (WHO names
    the program in the complaint).  Returns the timed calls' seconds, or None
    when any rank's result was wrong."""
    n = nbytes // 4
    pristine = (torch.arange(n, dtype=torch.int64) % 251 + rank).to(torch.float32)
    buf = torch.empty_like(pristine)
    t = torch.zeros(1, dtype=torch.float64)
    times = []
    for i in range(warmup + iters):
        buf.copy_(pristine)
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(buf, op=dist.ReduceOp.SUM)
        t[0] = time.perf_counter() - t0
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if i >= warmup:
            times.append(t.item())
    bad = 0
    for j in sorted({0, 1 % n, 250 % n, 251 % n, n // 2, n - 1}):
        want = world * (j % 251) + world * (world - 1) // 2
        if buf[j].item() != want:
            print("%s: rank %d element %d is %g, want %d" % (who, rank, j, buf[j].item(), want),
                  file=sys.stderr)
            bad = 1
    flag = torch.tensor([bad], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return None if flag.item() else times


def worker(rank, procs, nbytes, iters, warmup, port):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=procs)
    times = timed_all_reduce(rank, procs, nbytes, iters, warmup, "gloo_allreduce")
    if rank == 0 and times is not None:
        p99 = sorted(times)[max(0, -(-len(times) * 99 // 100) - 1)]
        print("gloo procs=%d bytes=%d median_ms=%.3f min_ms=%.3f p99_ms=%.3f"
              % (procs, nbytes, statistics.median(times) * 1e3, min(times) * 1e3, p99 * 1e3),
              flush=True)
    dist.destroy_process_group()
    if times is None:
        sys.exit(1)


def main():
    if len(sys.argv) != 5:
        print("usage: gloo_allreduce.py PROCS BYTES ITERS WARMUP", file=sys.stderr)
        sys.exit(2)
    procs, nbytes, iters, warmup = (int(a) for a in sys.argv[1:])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(procs, nbytes, iters, warmup, port), nprocs=procs, join=True)


if __name__ == "__main__":
    main()
