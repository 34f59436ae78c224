"""Worker for test_torch.py's test_allgather_begin: the C API's allgather in
two steps (unisum_allgather_begin, then unisum_allgather_supply), called
through ctypes as a C program would.

    allgather_begin.py rounds     exact results over rounds (float32, int64,
                                  uneven counts, a rank with none), the
                                  ranks supplying in different orders and
                                  late; the misuses fail clearly (a wait
                                  before the rows, a second supply, a
                                  supply of a plain allgather)
    allgather_begin.py join       every rank begins one and never supplies
                                  it; rank 0 joins at once while the others
                                  first run an allreduce, which needs its
                                  zeros (its join must not wait for the
                                  round it began); once all have joined
                                  the round ends with zeros (not supplied,
                                  it was not in flight: not poisoned)
    allgather_begin.py shutdown   a round begun and never supplied: the
                                  workers shut down, and the job ends well
    allgather_begin.py leaves     the same, but rank 0 leaves while the
                                  others still run an allreduce: its
                                  shutdown does not wait for their rows
                                  (which never come), and their error
                                  names it
    allgather_begin.py local      with several workers a machine, begin
                                  refuses (UNISUM_EINVAL)
    allgather_begin.py slots_join Horovod's allgather begins each slot's next
                                  round as a call returns; rank 1 returns
                                  from its last call only once rank 0 has
                                  joined (its begin is refused then), then
                                  joins: rank 0's join still returns
    allgather_begin.py sigint     a real SIGINT on rank 0 as Horovod's
                                  allgather supplies a begun round, and as
                                  synchronize() begins one: KeyboardInterrupt
                                  comes once each is on record, and every
                                  call on every rank still gives the right
                                  rows
"""

import ctypes
import os
import sys
import time

import torch

import unisum.torch as hvd
from unisum import _capi
from unisum.torch import ops as ut


def begin(tid, out, counts):
    h = ctypes.c_int64(0)
    arr = (ctypes.c_uint64 * len(counts))(*counts)
    rc = _capi.lib.unisum_allgather_begin(tid, out.data_ptr(), arr, ctypes.byref(h))
    return rc, h.value


def values(rank, i, count, dtype):
    return (torch.arange(count, dtype=torch.int64) + 1000 * rank + 7 * i).to(dtype)


def rounds(r, n):
    for dtype in (torch.float32, torch.int64):
        # The last: rows of several 256 KiB partitions, whose pulls go in
        # ring phases on 3 or more machines (src/worker/cuts.c).
        for counts in ([5000] * n, [3 + 1000 * q for q in range(n)], [0] + [777] * (n - 1),
                       [70000 * (q + 1) + q for q in range(n)]):
            total = sum(counts)
            tid = ut._declared("begin.%s.%d" % (str(dtype)[6:], counts[-1]), dtype, total, 0)
            for i in range(6):
                out = torch.full((total,), -1, dtype=dtype)
                rc, h = begin(tid, out, counts)
                assert rc == 0, rc
                if i == 0:
                    if counts[r] == 0:
                        # No rows of its own: every other row may be in
                        # before it supplies (here surely); still no wait.
                        time.sleep(0.3)
                    # Its rows are not there: the wait fails, never blocks.
                    t0 = time.monotonic()
                    rc = _capi.lib.unisum_poll_timeout(h, 2000)
                    assert rc == _capi.EINVAL, (rc, dtype, counts)
                    assert time.monotonic() - t0 < 1.0
                    assert _capi.lib.unisum_wait(h) == _capi.EINVAL
                time.sleep(0.002 * ((r + i) % n))       # late, in turns
                mine = values(r, i, counts[r], dtype)
                assert _capi.lib.unisum_allgather_supply(h, mine.data_ptr()) == 0
                if i == 1:
                    assert _capi.lib.unisum_allgather_supply(h, mine.data_ptr()) == _capi.EINVAL
                assert _capi.lib.unisum_wait(h) == 0
                want = torch.cat([values(q, i, counts[q], dtype) for q in range(n)])
                if not torch.equal(out, want):
                    raise AssertionError("rank %d: round %d of %s %s: got %s, want %s"
                                         % (r, i, dtype, counts, out, want))
            # A plain allgather's handle takes no rows.
            out = torch.empty(total, dtype=dtype)
            arr = (ctypes.c_uint64 * n)(*counts)
            h = ctypes.c_int64(0)
            mine = values(r, 9, max(counts[r], 1), dtype)   # never NULL: the C API's rule
            assert _capi.lib.unisum_allgather_async(tid, mine.data_ptr(), out.data_ptr(), arr,
                                                    ctypes.byref(h)) == 0
            assert _capi.lib.unisum_allgather_supply(h.value, mine.data_ptr()) == _capi.EINVAL
            assert _capi.lib.unisum_wait(h.value) == 0
            assert torch.equal(out, torch.cat([values(q, 9, counts[q], torch.int64).to(dtype)
                                               for q in range(n)]))
    print("rank %d: allgather begin ok" % r, flush=True)


def join(r, n):
    counts = [4000] * n
    tid = ut._declared("begin.join", torch.float32, sum(counts), 0)
    out = torch.full((sum(counts),), -1.0)
    rc, h = begin(tid, out, counts)
    assert rc == 0, rc
    hvd.barrier()       # every rank has begun it
    late = None
    if r != 0:
        got = hvd.allreduce(torch.ones(3), op=hvd.Sum, name="begin.before.join")
        assert torch.equal(got, torch.full((3,), float(n - 1))), got   # rank 0's zeros
    if r == n - 1:
        # Its join pushes nothing for the round, then waits for this
        # allreduce, which the others' joins complete with zeros: rank 1's
        # comes meanwhile, before rank 2 has pushed its part of the round
        # (4 ranks), and must not poison that round.
        late = hvd.allreduce_async(torch.ones(3), op=hvd.Sum, name="begin.in.join")
    elif r != 0:
        time.sleep(1.0 * r)
    last = hvd.join()
    assert 0 <= last < n
    if late is not None:
        assert torch.equal(hvd.synchronize(late), torch.ones(3))
    assert _capi.lib.unisum_wait(h) == 0
    mine = slice(r * counts[r], (r + 1) * counts[r])
    want = torch.zeros(sum(counts))
    want[mine] = -1.0   # its own rows stay as they were
    assert torch.equal(out, want), out
    print("rank %d: allgather begin join ok" % r, flush=True)


def shutdown(r, n):
    counts = [1000] * n
    tid = ut._declared("begin.shutdown", torch.float32, sum(counts), 0)
    out = torch.empty(sum(counts))
    rc, h = begin(tid, out, counts)
    assert rc == 0, rc
    print("rank %d: allgather begin shutdown ok" % r, flush=True)
    hvd.shutdown()
    assert _capi.lib.unisum_shutdown() == 0


def leaves(r, n):
    counts = [1000] * n
    tid = ut._declared("begin.leaves", torch.float32, sum(counts), 0)
    out = torch.empty(sum(counts))      # alive while the C library writes into it
    rc, h = begin(tid, out, counts)
    assert rc == 0, rc
    hvd.barrier()
    if r == 0:
        hvd.shutdown()
        assert _capi.lib.unisum_shutdown() == 0
        print("rank 0: allgather begin leaves ok", flush=True)
        return
    try:
        hvd.allreduce(torch.ones(3), op=hvd.Sum, name="begin.after.leave")
    except Exception as e:  # noqa: B902 (any error, as long as it names the rank)
        assert "worker 0" in str(e), e
        print("rank %d: allgather begin leaves ok" % r, flush=True)
        os._exit(0)
    raise AssertionError("an allreduce without rank 0 did not fail")


def slots_join(r, n):
    from unisum._horovod import slots as _horovod
    x = torch.arange(4, dtype=torch.float32) + 10 * r
    want = torch.cat([torch.arange(4, dtype=torch.float32) + 10 * q for q in range(n)])
    for _ in range(6):
        assert torch.equal(hvd.allgather(x), want)
    assert any(s.next is not None for s in _horovod._slots.values()), "no round was begun"
    h = hvd.allgather_async(x)
    if r == 0:
        assert torch.equal(hvd.synchronize(h), want)
    else:
        time.sleep(1.5)     # rank 0 has joined: this rank's begin is refused
        assert torch.equal(hvd.synchronize(h), want)
    t0 = time.monotonic()
    last = hvd.join()
    took = time.monotonic() - t0
    assert last == n - 1 and took < 15, (last, took)
    assert torch.equal(hvd.allgather(x), want)      # the slots start afresh
    print("rank %d: allgather begin slots_join ok" % r, flush=True)


def sigint(r, n):
    import signal
    from unisum._horovod import slots as _horovod
    x = torch.arange(4, dtype=torch.float32) + 10 * r

    def want(i):
        return torch.cat([torch.arange(4, dtype=torch.float32) + 10 * q + 100 * i
                          for q in range(n)])
    for i in range(6):
        assert torch.equal(hvd.allgather(x + 100 * i), want(i))
    lib = _capi.lib
    for point in ("supply", "begin"):
        real = getattr(lib, "unisum_allgather_" + point)

        def interrupted(*a, real=real, point=point):
            setattr(lib, "unisum_allgather_" + point, real)
            if point == "supply":
                signal.raise_signal(signal.SIGINT)      # before the C call ...
                return real(*a)
            rc = real(*a)
            signal.raise_signal(signal.SIGINT)          # ... or as it returns
            return rc
        if r == 0:
            setattr(lib, "unisum_allgather_" + point, interrupted)
        for i in range(6, 9):
            try:
                h = hvd.allgather_async(x + 100 * i)
            except KeyboardInterrupt:
                assert r == 0 and point == "supply" and i == 6, (point, i)
                h = None
            if h is None:
                continue    # its rows are supplied: the others' call ends
            try:
                got = hvd.synchronize(h)
            except KeyboardInterrupt:
                assert r == 0 and point == "begin", (point, i)
                got = hvd.synchronize(h)    # the same handle, retried
            assert torch.equal(got, want(i)), (point, i, got)
        assert getattr(lib, "unisum_allgather_" + point) is real, point + " was not called"
    assert _horovod._spec_counts["begun"] > 0
    print("rank %d: allgather begin sigint ok" % r, flush=True)


def local(r, n):
    assert hvd.local_size() > 1
    tid = ut._declared("begin.local", torch.float32, 10 * n, 0)
    rc, _ = begin(tid, torch.empty(10 * n), [10] * n)
    assert rc == _capi.EINVAL, rc
    print("rank %d: allgather begin local ok" % r, flush=True)


def main():
    hvd.init()
    {"rounds": rounds, "join": join, "shutdown": shutdown, "leaves": leaves,
     "local": local, "slots_join": slots_join, "sigint": sigint}[sys.argv[1]](
        hvd.rank(), hvd.size())


if __name__ == "__main__":
    main()
