"""Worker: the same name pushed with different shapes on two ranks.

    mismatch.py OUTDIR

Rank 0 pushes float32[10] as 'x', every other rank float32[20].  Every rank
must get unisum.UnisumError (not hang, not succeed); then all ranks finish a
healthy push_pull.  Writes OUTDIR/rank<r>.json with what happened.
"""

import sys
import traceback

import torch

import common
import unisum
import unisum.torch as us


def main():
    outdir = sys.argv[1]
    torch.set_num_threads(1)
    us.init()
    rank, size = us.rank(), us.size()
    result = {"rank": rank, "size": size}
    n = 10 if rank == 0 else 20
    try:
        out = us.push_pull(torch.ones(n), name="x")
        result["error"] = None
        result["returned"] = out.tolist()
    except unisum.UnisumError as e:
        result["error"] = "UnisumError"
        result["message"] = str(e)
        result["code"] = e.code
    except Exception as e:  # the wrong kind of error: reported, the test fails on it
        result["error"] = type(e).__name__
        result["message"] = "".join(traceback.format_exception(e))
    # Written before the healthy operation, so a hang there still leaves a trace.
    common.write_json(outdir, rank, result)

    healthy = us.push_pull(torch.full((5,), float(rank + 1)), average=False, name="healthy")
    result["healthy"] = healthy.tolist()
    us.barrier()
    common.write_json(outdir, rank, result)
    us.shutdown()


if __name__ == "__main__":
    main()
