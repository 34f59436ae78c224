#!/usr/bin/python3
"""collectives.py - allgather, reduce-scatter and alltoall, timed the same
way on unisum (Horovod's API) and on PyTorch's gloo.

    collectives.py unisum --mib 4,64 --iters I --warmup K
        (one worker of a job that `unisum launch` started)
    collectives.py gloo --rank R --world W --master ADDR:PORT --mib 4,64
                   --iters I --warmup K [--ifname IF]

For each size M (MiB of float32):
- allgather: every rank contributes M/W and receives M;
- reducescatter: every rank contributes M and keeps its M/W of the sum;
- alltoall: every rank sends M/W to each rank (M in all) and receives M.

gloo: all_gather into views of one tensor, all_to_all_single, and for
reduce-scatter dist.reduce_scatter when this torch's gloo has it, else
all_reduce and a slice (the line says which: "reducescatter" or
"reducescatter=allreduce+slice").  unisum: hvd.allgather, hvd.reducescatter
(op=Sum) and hvd.alltoall, on the Summation Service.

Each call is preceded by a barrier and timed on every rank; a call's time is
the slowest rank's (an allreduce of Max over the ranks).  K warm-up calls
are not counted.  With --loop the calls run back to back instead, as a
training loop's would with nothing between them: one barrier, then I calls
timed together, and the slowest rank's time over I is the one figure
(median_s and min_s alike).  Values are small integers, so every result is exact; the
last result of each is checked on every rank (exit 1 when wrong).  Rank 0
prints one line per collective and size:

    SYSTEM OP mib=M world=W median_s=.. min_s=..
"""
import argparse
import datetime
import os
import statistics
import sys
import time

import torch


def values(rank, n, salt):
    """n float32 values, exact in any sum of a few ranks."""
    return ((torch.arange(n, dtype=torch.int64) + salt) % 251 + rank).to(torch.float32)


class Gloo:
    """The collectives on torch.distributed's gloo."""
    name = "gloo"

    def __init__(self, a):
        import torch.distributed as dist
        self.dist = dist
        if a.ifname:
            os.environ["GLOO_SOCKET_IFNAME"] = a.ifname
        addr, _, port = a.master.rpartition(":")
        dist.init_process_group("gloo", init_method="tcp://%s:%s" % (addr, port), rank=a.rank,
                                world_size=a.world, timeout=datetime.timedelta(seconds=a.timeout))
        self.rank, self.world = a.rank, a.world
        self.rs_label = "reducescatter"
        try:
            probe = [torch.zeros(1) for _ in range(self.world)]
            dist.reduce_scatter(torch.zeros(1), probe)
        except RuntimeError:
            self.rs_label = "reducescatter=allreduce+slice"

    def barrier(self):
        self.dist.barrier()

    def slowest(self, seconds):
        t = torch.tensor([seconds], dtype=torch.float64)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return float(t[0])

    def allgather(self, x, out):
        self.dist.all_gather(list(out.chunk(self.world)), x)
        return out

    def reducescatter(self, x, out):
        if self.rs_label == "reducescatter":
            self.dist.reduce_scatter(out, list(x.chunk(self.world)))
            return out
        y = x.clone()
        self.dist.all_reduce(y)
        return y.chunk(self.world)[self.rank]

    def alltoall(self, x, out):
        self.dist.all_to_all_single(out, x)
        return out

    def close(self):
        self.dist.destroy_process_group()


class Unisum:
    """The collectives on unisum's Summation Service, by Horovod's names."""
    name = "unisum"
    rs_label = "reducescatter"

    def __init__(self, a):
        import unisum.torch as hvd
        self.hvd = hvd
        hvd.init()
        self.rank, self.world = hvd.rank(), hvd.size()

    def barrier(self):
        self.hvd.barrier()

    def slowest(self, seconds):
        return float(self.hvd.allreduce(torch.tensor([seconds], dtype=torch.float64),
                                        op=self.hvd.Max)[0])

    def allgather(self, x, out):
        return self.hvd.allgather(x)

    def reducescatter(self, x, out):
        return self.hvd.reducescatter(x, op=self.hvd.Sum)

    def alltoall(self, x, out):
        return self.hvd.alltoall(x)

    def close(self):
        self.hvd.shutdown()


def run(sys_, mib, iters, warmup, ops, loop=False):
    """Times the collectives named in `ops` at `mib` (`loop`: back to back);
    rank 0 prints their lines.  Returns False when a result was wrong."""
    w, r = sys_.world, sys_.rank
    n = int(mib * 1024 * 1024) // 4 // w * w          # elements of the whole tensor
    part = n // w
    ok = True
    cases = [
        ("allgather", values(r, part, 1), torch.empty(n),
         torch.cat([values(q, part, 1) for q in range(w)])),
        (sys_.rs_label, values(r, n, 2), torch.empty(part),
         sum(values(q, n, 2) for q in range(w)).chunk(w)[r]),
        ("alltoall", values(r, n, 3), torch.empty(n),
         torch.cat([values(q, n, 3).chunk(w)[r] for q in range(w)])),
    ]
    for label, x, out, want in cases:
        if label.split("=")[0] not in ops:
            continue
        fn = getattr(sys_, label.split("=")[0])
        times = []
        got = None
        if loop:
            for i in range(warmup):
                got = fn(x, out)
            sys_.barrier()
            t0 = time.perf_counter()
            for i in range(iters):
                got = fn(x, out)
            times.append(sys_.slowest(time.perf_counter() - t0) / iters)
        else:
            for i in range(warmup + iters):
                sys_.barrier()
                t0 = time.perf_counter()
                got = fn(x, out)
                slowest = sys_.slowest(time.perf_counter() - t0)
                if i >= warmup:
                    times.append(slowest)
        if not torch.equal(got, want):
            print("%s %s: rank %d's result is wrong" % (sys_.name, label, r), file=sys.stderr)
            ok = False
        if r == 0:
            print("%s %s mib=%g world=%d median_s=%.6f min_s=%.6f" % (
                sys_.name, label, mib, w, statistics.median(times), min(times)), flush=True)
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("system", choices=["unisum", "gloo"])
    ap.add_argument("--rank", type=int)
    ap.add_argument("--world", type=int)
    ap.add_argument("--master", help="gloo: ADDR:PORT of rank 0's store")
    ap.add_argument("--ifname", default="", help="gloo: GLOO_SOCKET_IFNAME ('' = gloo's choice)")
    ap.add_argument("--mib", default="4,64")
    ap.add_argument("--ops", default="allgather,reducescatter,alltoall",
                    help="which collectives, comma-separated")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--loop", action="store_true",
                    help="time the calls back to back, not each after a barrier")
    a = ap.parse_args()
    if a.system == "gloo" and (a.rank is None or a.world is None or not a.master):
        ap.error("gloo needs --rank, --world and --master")
    torch.set_num_threads(1)
    sys_ = Gloo(a) if a.system == "gloo" else Unisum(a)
    ok = True
    for mib in (float(m) for m in a.mib.split(",")):
        ok = run(sys_, mib, a.iters, a.warmup, a.ops.split(","), a.loop) and ok
    sys_.close()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
