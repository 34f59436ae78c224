"""Worker: a script that ends without calling shutdown(), as BytePS's and
Horovod's examples do.

    ending.py MODE

MODE:
  clean    every rank push_pulls twice (checking the sums) and the script
           ends: the job must end normally (the plugin leaves at exit).
  early    rank 0 push_pulls once and ends; the others push_pull again and
           must fail, naming worker 0, instead of waiting for it forever.
  barrier  every rank push_pulls once; rank 0 ends and the others enter a
           barrier, and must fail the same way.
  inflight rank 0 starts a push_pull of a tensor the others never push and
           ends without waiting for it: leaving would hang, so it ends
           without a goodbye and the job fails naming it.
"""

import sys
import time

import torch

import unisum.torch as us


def main():
    mode = sys.argv[1]
    torch.set_num_threads(1)
    us.init()
    rank, size = us.rank(), us.size()
    rounds = 1 if mode == "barrier" or (rank == 0 and mode == "early") else 2
    for r in range(rounds):
        got = us.push_pull(torch.full((10,), float(rank + r)), average=False, name="t")
        want = float(sum(range(size)) + size * r)   # rank + r summed over ranks
        assert got.eq(want).all(), "round %d: %s, not %s" % (r, got.tolist(), want)
        print("rank %d round %d sum ok" % (rank, r), flush=True)
    if mode == "barrier" and rank != 0:
        us.barrier()
    if mode == "inflight":
        if rank == 0:
            us.push_pull_async(torch.ones(10), name="only-rank-0")
        else:
            time.sleep(30)      # the job fails before this ends
    print("rank %d ends" % rank, flush=True)


if __name__ == "__main__":
    main()
