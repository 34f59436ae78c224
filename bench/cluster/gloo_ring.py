#!/usr/bin/python3
"""gloo_ring.py - PyTorch gloo all_reduce across the hosts of netns.sh.

    gloo_ring.py --rank R --world W --master ADDR:PORT --bytes N
                 --iters I --warmup K [--ifname eth0] [--timeout S]

One process of a W-process job; the caller starts one per emulated host,
e.g. `netns.sh exec PREFIX R /usr/bin/python3 gloo_ring.py --rank R ...`,
rank 0 on the host whose address is ADDR (it serves the rendezvous store
on PORT, init_method tcp://ADDR:PORT).  gloo talks over --ifname (default
eth0, the host's NIC; GLOO_SOCKET_IFNAME), torch.set_num_threads(1).

Every rank runs float32 all_reduce(SUM) on N bytes (gloo's ring for large
CPU tensors: reduce-scatter then all-gather, 2(W-1)/W x N bytes sent and
received per rank).  Rank r fills element j with (j mod 251) + r, so every
sum is exact in float32.  all_reduce is in place, so the input is copied
back from a pristine tensor before each call, outside the timing.  Each
call is preceded by a barrier and timed on every rank; the time of a call
is the maximum over ranks (an all_reduce(MAX) of the times after the timed
call).  K warm-up calls are not counted.  Rank 0 prints one line:

    gloo world=W bytes=N median_s=.. min_s=.. iters=I

and a few elements of the last result are checked exactly on every rank
(exit 1 when any is wrong); the loop is bench/peers/gloo_allreduce.py's.
"""
import argparse
import datetime
import os
import statistics
import sys

import torch
import torch.distributed as dist

# The timed loop and its check are the local peer's (bench/peers).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "peers"))
from gloo_allreduce import timed_all_reduce  # noqa: E402


def job_args(ap, timeout=300):
    """The options of one process of a gloo job on netns.sh's hosts (also
    ddp_replay.py's)."""
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--master", required=True, help="ADDR:PORT of rank 0's store")
    ap.add_argument("--iters", type=int, required=True)
    ap.add_argument("--ifname", default="eth0",
                    help="interface gloo uses (GLOO_SOCKET_IFNAME); '' = gloo's choice")
    ap.add_argument("--timeout", type=float, default=timeout,
                    help="seconds to wait for the other ranks and for each collective")


def join(ap, a):
    """Checks job_args' values and joins the gloo job (one thread)."""
    if not (0 <= a.rank < a.world) or a.iters < 1:
        ap.error("need 0 <= rank < world and iters >= 1")
    addr, sep, port = a.master.rpartition(":")
    if not sep or not addr or not port.isdigit():
        ap.error("--master must be ADDR:PORT")
    torch.set_num_threads(1)
    if a.ifname:
        os.environ["GLOO_SOCKET_IFNAME"] = a.ifname
    dist.init_process_group("gloo", init_method="tcp://%s:%s" % (addr, port),
                            rank=a.rank, world_size=a.world,
                            timeout=datetime.timedelta(seconds=a.timeout))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    job_args(ap)
    ap.add_argument("--bytes", type=int, required=True, help="message size (multiple of 4)")
    ap.add_argument("--warmup", type=int, default=1)
    a = ap.parse_args()
    if a.bytes < 4 or a.bytes % 4 or a.warmup < 0:
        ap.error("need bytes a positive multiple of 4 and warmup >= 0")
    join(ap, a)
    times = timed_all_reduce(a.rank, a.world, a.bytes, a.iters, a.warmup, "gloo_ring")
    if a.rank == 0 and times is not None:
        print("gloo world=%d bytes=%d median_s=%.6f min_s=%.6f iters=%d"
              % (a.world, a.bytes, statistics.median(times), min(times), a.iters),
              flush=True)
    dist.destroy_process_group()
    if times is None:
        sys.exit(1)


if __name__ == "__main__":
    main()
