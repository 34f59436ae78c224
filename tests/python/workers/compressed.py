"""Worker: push_pulls of compressed tensors (unisum_declare_ex), for the
two-level scheme's reference in test_compress.py.

    compressed.py OUTDIR ROUNDS

Every tensor of compress_ref.TENSORS runs ROUNDS push_pulls of the inputs
compress_ref.worker_input gives; each rank writes what it got back, and
the wire bytes it pushed and pulled, to OUTDIR/rank<r>.npz.  Then the
errors: bad specs fail at declare, naming the key; a tensor the ranks
declare with two specs fails on every rank, naming both, and a tensor
after it still sums.
"""

import ctypes
import os
import sys

import numpy as np

import compress_ref
import unisum.torch as us
from unisum import _capi


def push_pull(tid, x, flags=0):
    out = np.empty_like(x)
    h = ctypes.c_int64()
    rc = _capi.lib.unisum_push_pull_async(tid, x.ctypes.data, out.ctypes.data, flags,
                                          ctypes.byref(h))
    if rc == 0:
        rc = _capi.lib.unisum_wait(h.value)
    return rc, out


def last_error():
    return _capi.lib.unisum_last_error().decode("utf-8", "replace")


def main():
    outdir, rounds = sys.argv[1], int(sys.argv[2])
    us.init()
    rank, size = us.rank(), us.size()
    lib = _capi.lib
    res = {}
    for name, (spec, count, flags) in compress_ref.TENSORS.items():
        tid = lib.unisum_declare_ex(name.encode(), _capi.FLOAT32, count, 0, spec.encode())
        assert tid >= 0, (name, tid, last_error())
        got = []
        for r in range(rounds):
            rc, out = push_pull(tid, compress_ref.worker_input(name, rank, r, count), flags)
            assert rc == 0, (name, r, rc, last_error())
            got.append(out)
        res[name] = np.stack(got)
    stats = us.get_stats()
    res["wire_bytes"] = np.array([stats["bytes_pushed"], stats["bytes_pulled"]], np.int64)

    # A bad spec fails at declare, naming what is wrong; the job goes on.
    for spec, word in (("onebit,bogus=1", "bogus"), ("topk,k=-2", "k"), ("zip", "zip")):
        rc = lib.unisum_declare_ex(b"bad", _capi.FLOAT32, 100000, 0, spec.encode())
        assert rc == _capi.EINVAL and word in last_error(), (spec, rc, last_error())
    rc = lib.unisum_declare_ex(b"bad", _capi.FLOAT64, 100000, 0, b"onebit")
    assert rc == _capi.EINVAL and "float32" in last_error(), (rc, last_error())
    # "none" (and "") declare an uncompressed tensor, of any dtype.
    tid = lib.unisum_declare_ex(b"c.none", _capi.FLOAT64, 100000, 0, b"none")
    assert tid >= 0, last_error()
    rc, out = push_pull(tid, np.full(100000, rank + 0.5))
    assert rc == 0 and np.all(out == sum(r + 0.5 for r in range(size))), (rc, out[:2])

    # Two specs for one tensor: every rank's push_pull fails, naming both.
    spec = "onebit" if rank == 0 else "topk,k=0.5"
    tid = lib.unisum_declare_ex(b"c.mismatch", _capi.FLOAT32, 20000, 0, spec.encode())
    if tid >= 0:
        rc, _ = push_pull(tid, np.ones(20000, np.float32))
    else:
        rc = tid
    err = last_error()
    assert rc == _capi.EMISMATCH and "onebit" in err and "topk" in err, (rc, err)
    print("rank %d mismatch refused: %s" % (rank, err), flush=True)

    # ... and the job goes on.
    tid = lib.unisum_declare_ex(b"c.after", _capi.FLOAT32, 20000, 0, b"fp16")
    rc, out = push_pull(tid, np.full(20000, rank + 1, np.float32))
    assert rc == 0 and np.all(out == size * (size + 1) / 2), (rc, out[:4], last_error())

    np.savez(os.path.join(outdir, "rank%d.npz" % rank), **res)
    print("rank %d compressed ok" % rank, flush=True)
    us.shutdown()


if __name__ == "__main__":
    main()
