"""Worker: Horovod's join with uneven data, every result checked exactly.

    join.py

Twice: rank q has 2 + q steps (then 2 + n-1-q), each a named Sum and an
unnamed Average allreduce; a rank out of steps calls join(), and its zeros
stand in for it: each step's result is the sum over the ranks that still
had data (the Average divides by size(), as Horovod's).  The rank with the
most steps then finds a broadcast, an allgather and an alltoall refused
(RuntimeError),
every rank gets the same last rank from join(), and unnamed collectives
after it agree, allgathers on the reused tensors that join() retired
included.  Prints "rank R: join ok".
"""

import torch

import unisum.torch as hvd


def main():
    torch.set_num_threads(1)
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    for rep in range(2):
        steps = [2 + (q if rep == 0 else n - 1 - q) for q in range(n)]
        most = max(range(n), key=lambda q: steps[q])
        for s in range(steps[r]):
            x = torch.full((5, 7), float((r + 1) * (s + 1)))
            want = float(sum((q + 1) * (s + 1) for q in range(n) if steps[q] > s))
            got = hvd.allreduce(x, name="join.sum", op=hvd.Sum)
            assert torch.equal(got, torch.full((5, 7), want)), (rep, s, got[0, 0], want)
            got = hvd.allreduce(x.double())
            assert torch.equal(got, torch.full((5, 7), want / n, dtype=torch.float64)), \
                (rep, s, got[0, 0], want / n)
        if r == most:
            for what, call in (("broadcast", lambda: hvd.broadcast(torch.ones(3), r, name="join.b")),
                               ("allgather", lambda: hvd.allgather(torch.ones(2))),
                               ("alltoall", lambda: hvd.alltoall(torch.ones(n)))):
                try:
                    call()
                except RuntimeError as e:
                    assert "joined" in str(e), e
                else:
                    raise AssertionError("a %s while ranks had joined did not raise" % what)
        last = hvd.join()
        assert last == most, (rep, last, most)
        assert hvd.allgather_object((r, last)) == [(q, most) for q in range(n)]
        # The gathering collectives' reused tensors work on after a join
        # (unisum.torch retires them there: join may have poisoned one).
        for i in range(5):
            got = hvd.allgather(torch.full((2,), 10 * i + r))
            assert torch.equal(got, torch.tensor([10 * i + q for q in range(n) for _ in "ab"])), got
            got = hvd.alltoall(torch.full((n,), 10 * i + r))
            assert torch.equal(got, torch.tensor([10 * i + q for q in range(n)])), got
    # An allgather still unsynchronized at join(): its stage runs first, and
    # its result survives the slots' retirement.
    h = hvd.allgather_async(torch.tensor([r]))
    hvd.join()
    assert torch.equal(hvd.synchronize(h), torch.arange(n))
    assert torch.equal(hvd.allgather(torch.tensor([r])), torch.arange(n))
    print("rank %d: join ok" % r, flush=True)


if __name__ == "__main__":
    main()
