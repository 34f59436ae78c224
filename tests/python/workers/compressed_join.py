"""Worker: unisum_join while a compressed tensor is in flight.

    compressed_join.py

Every rank declares a onebit tensor and runs one push_pull of it; then
the last rank joins while the others run a second one.  A joined rank
cannot contribute zeros through a compressor's momentum and error
feedback, so the tensor fails on every rank, naming it, instead of being
summed wrongly or left waiting.  Prints "rank R: compressed join refused".
"""

import ctypes

import numpy as np

import unisum.torch as us
from unisum import _capi

N = 50000


def main():
    us.init()
    rank, size = us.rank(), us.size()
    lib = _capi.lib
    tid = lib.unisum_declare_ex(b"cj.onebit", _capi.FLOAT32, N, 0, b"onebit,ef=vanilla")
    assert tid >= 0
    x = np.ones(N, np.float32)
    out = np.empty_like(x)
    assert lib.unisum_push_pull(tid, x.ctypes.data, out.ctypes.data, 0) == 0
    # Every rank has the first round before the last joins: else the join
    # may find a slower rank's first round still in flight and fail it.
    assert lib.unisum_barrier() == 0
    if rank == size - 1:
        rc = lib.unisum_join()
    else:
        h = ctypes.c_int64()
        rc = lib.unisum_push_pull_async(tid, x.ctypes.data, out.ctypes.data, 0, ctypes.byref(h))
        if rc == 0:
            rc = lib.unisum_wait(h.value)
    err = lib.unisum_last_error().decode()
    assert rc < 0 and "compressed 'onebit,ef=vanilla'" in err and "joined" in err, (rc, err)
    print("rank %d: compressed join refused" % rank, flush=True)


if __name__ == "__main__":
    main()
