"""Worker: a signal's exception (Ctrl-C's KeyboardInterrupt) that comes
right as an operation starts.  CPython raises it when the C call that
started the operation returns, before its result (the handle) is kept;
here rank 0's C call is wrapped to raise KeyboardInterrupt just after the
real call returns, which is where the interpreter raises it.

    interrupted.py push_pull|allgather|completed|stage|join|rejoin|speculated

push_pull  rank 0's push_pull_async of 4 MiB is interrupted as it starts;
           then it takes a new result buffer of the same size (from the
           result pool) and fills it with -1.  Rank 1 pushes only after
           that, so the sum lands after: the new buffer must still hold
           -1 (before, the interrupted operation's buffer went back to the
           pool while the C library still wrote into it).
allgather  rank 0's allgather (its second stage, the C call) is
           interrupted; synchronize() raises KeyboardInterrupt, and a
           second synchronize() of the same handle returns every rank's
           rows (before, it raised again and rank 1 waited for ever).
           Then one more allgather, on every rank.
speculated rank 0 speculates on its slot's layout (_horovod's
           _speculate) while rank 1 cannot (its last call on the slot
           unsynchronized), and rank 0's rows change, so the layout does
           not hold: rank 1 runs that round with zeros first.  Rank 1's
           start of it is interrupted, and rank 0's wait for it; each
           synchronize() raises KeyboardInterrupt once, and a second
           returns the right rows.  Then one more allgather.

completed  rank 0's waits are interrupted as they end (a Ctrl-C that
           lands while the C library waits comes as its call returns):
           a push_pull's, an allgather's (its shapes' exchange, whose
           stage must still run) and a barrier's.  Each synchronize()
           raises KeyboardInterrupt, and a second returns the right
           result (before, the answer was lost with the handle: "unknown
           or already released handle", and rank 1 waited for ever for
           the allgather's rows); a second barrier() returns at once
           instead of entering a barrier ahead of rank 1's.

stage      a real SIGINT reaches rank 0 inside an allgather's second
           stage (as it reads the shapes' exchange), before its rows
           start: synchronize() raises KeyboardInterrupt once the rows
           are on their way, and a second returns every rank's rows
           (before, the stage stopped there: the rows never started
           here, a retry raised the same KeyboardInterrupt, and rank 1
           waited for ever).  Then one more allgather.

join       a SIGINT reaches rank 0 while join() blocks in the C library:
           it comes once the join has ended and its bookkeeping is done,
           and the next join() returns the last rank at once (before,
           the answer was lost, and a second join() began a join of its
           own: rank 1's allreduce got rank 0's zeros, then a hang).
rejoin     (elastic) rank 0's wait of a push_pull and then its barrier
           are interrupted as they end, and neither is called again:
           the job re-forms (rejoin()) and runs on.  The new membership
           numbers its operations afresh: its first push_pull must not
           get the old one's kept answer (before: an unfilled buffer,
           returned at once), nor its first barrier() pass as the old
           one (before: a hang).

Each rank prints "rank R: interrupted MODE ok".
"""

import ctypes
import signal
import sys
import time

import torch

import unisum.torch as us
from unisum.torch import _memory as umem
from unisum import _capi

N = 1 << 20     # float32: 4 MiB, a pooled result


def interrupting(name):
    """Wraps the C function `name` so that its next call raises
    KeyboardInterrupt once the real call has returned; returns the
    function that undoes it."""
    real = getattr(_capi.lib, name)

    def wrapped(*args):
        setattr(_capi.lib, name, real)
        real(*args)
        raise KeyboardInterrupt

    setattr(_capi.lib, name, wrapped)
    return lambda: setattr(_capi.lib, name, real)


def push_pull(rank):
    t = torch.full((N,), float(rank + 1))
    if rank == 0:
        undo = interrupting("unisum_push_pull_async")
        try:
            us.push_pull_async(t, average=False, name="interrupted")
            raise SystemExit("rank 0: push_pull_async was not interrupted")
        except KeyboardInterrupt:
            pass
        undo()
        fresh = umem._result((N,), torch.float32)
        fresh.fill_(-1.0)
        us.barrier()                    # now rank 1 pushes
        us.barrier()                    # and has its sum
        time.sleep(0.5)
        bad = int((fresh != -1.0).sum())
        if bad:
            raise SystemExit("rank 0: %d elements of a new result buffer were overwritten by "
                             "the interrupted push_pull" % bad)
    else:
        us.barrier()
        got = us.push_pull(t, average=False, name="interrupted")
        if not torch.equal(got, torch.full((N,), 3.0)):
            raise SystemExit("rank 1: wrong sum %s" % got[:4].tolist())
        us.barrier()


def allgather(rank, size):
    t = torch.full((N // size,), float(rank + 1))
    want = torch.cat([torch.full((N // size,), float(q + 1)) for q in range(size)])
    h = us.allgather_async(t)
    if rank == 0:
        undo = interrupting("unisum_allgather_async")
        try:
            us.synchronize(h)
            raise SystemExit("rank 0: the allgather was not interrupted")
        except KeyboardInterrupt:
            pass
        undo()
    got = us.synchronize(h)
    if not torch.equal(got, want):
        raise SystemExit("rank %d: wrong allgather %s" % (rank, got[[0, -1]].tolist()))
    if not torch.equal(us.allgather(t), want):
        raise SystemExit("rank %d: the next allgather is wrong" % rank)


def interrupting_answer(name, ended):
    """Wraps the C function `name` (a wait that writes its answer into its
    last argument) so that its next call that ends the wait (a non-zero
    answer; with `ended` False, one that finds the operation still in
    flight) raises KeyboardInterrupt once the real call has returned, as a
    Ctrl-C then does; returns the function that undoes it."""
    real = getattr(_capi.lib, name)

    def wrapped(*args):
        rc = real(*args)
        if (rc != 0) == ended:
            setattr(_capi.lib, name, real)
            raise KeyboardInterrupt
        return rc

    setattr(_capi.lib, name, wrapped)
    return lambda: setattr(_capi.lib, name, real)


def signalling(owner, name, after=False):
    """Wraps owner.name so that its next call gets a real SIGINT, before
    the real call (after it, with `after`: one that came while it
    blocked); returns whether that call has happened."""
    real = getattr(owner, name)

    def wrapped(*args):
        setattr(owner, name, real)
        if not after:
            signal.raise_signal(signal.SIGINT)
        got = real(*args)
        if after:
            signal.raise_signal(signal.SIGINT)
        return got

    setattr(owner, name, wrapped)
    return lambda: getattr(owner, name) is real


def interrupted_once(what, call):
    """call() must raise KeyboardInterrupt."""
    try:
        call()
    except KeyboardInterrupt:
        return
    raise SystemExit("rank 0: %s was not interrupted" % what)


def completed(rank, size):
    t = torch.full((N,), float(rank + 1))
    h = us.push_pull_async(t, average=False, name="completed")
    if rank == 0:
        undo = interrupting_answer("unisum_poll_timeout_into", True)
        interrupted_once("the push_pull's wait", lambda: us.synchronize(h))
        undo()
    got = us.synchronize(h)
    if not torch.equal(got, torch.full((N,), float(size * (size + 1) // 2))):
        raise SystemExit("rank %d: wrong push_pull %s" % (rank, got[:2].tolist()))

    rows = torch.full((3, 2), float(rank + 1))
    want = torch.cat([torch.full((3, 2), float(q + 1)) for q in range(size)])
    h = us.allgather_async(rows)
    if rank == 0:
        undo = interrupting_answer("unisum_poll_timeout_into", True)
        interrupted_once("the allgather's wait", lambda: us.synchronize(h))
        undo()
    got = us.synchronize(h)
    if not torch.equal(got, want):
        raise SystemExit("rank %d: wrong allgather %s" % (rank, got.tolist()))

    if rank == 0:
        undo = interrupting_answer("unisum_barrier_timeout_into", True)
        interrupted_once("the barrier", us.barrier)
        undo()
    us.barrier()        # rank 0: the same barrier, ended already
    # Paired right: had rank 0's second barrier() entered a new barrier,
    # it would wait there for rank 1's next one, and rank 1 here for it.
    got = us.push_pull(torch.full((4,), float(rank + 1)), average=False, name="after")
    if not torch.equal(got, torch.full((4,), float(size * (size + 1) // 2))):
        raise SystemExit("rank %d: wrong push_pull after the barrier %s" % (rank, got.tolist()))


def stage(rank, size):
    from unisum._horovod import gather as hgather
    from unisum.torch import _core as ucore
    rows = torch.full((2, 3), float(rank + 1))
    want = torch.cat([torch.full((2, 3), float(q + 1)) for q in range(size)])
    h = us.allgather_async(rows)
    if rank == 0:
        ran = signalling(hgather, "_agreed")
        interrupted_once("the allgather's stage", lambda: us.synchronize(h))
        if not ran():
            raise SystemExit("rank 0: the stage did not run")
    got = us.synchronize(h)
    if not torch.equal(got, want):
        raise SystemExit("rank %d: wrong allgather %s" % (rank, got.tolist()))
    # Again, the SIGINT coming just before the hold begins (found in
    # review: the stage was taken off the operation before that, and lost).
    h = us.allgather_async(rows)
    if rank == 0:
        ran = signalling(ucore, "_getsignal")       # the hold's first step
        interrupted_once("the allgather's stage, as its hold began", lambda: us.synchronize(h))
        if not ran():
            raise SystemExit("rank 0: the stage's hold did not begin")
    got = us.synchronize(h)
    if not torch.equal(got, want):
        raise SystemExit("rank %d: wrong allgather %s" % (rank, got.tolist()))
    if not torch.equal(us.allgather(rows), want):
        raise SystemExit("rank %d: the next allgather is wrong" % rank)
    # A handler a native library installed (here: SIGINT ignored, set
    # through libc) is not replaced by a stage's hold.
    libc = ctypes.CDLL(None)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.signal(signal.SIGINT, 1)           # SIG_IGN
    if not torch.equal(us.allgather(rows), want):
        raise SystemExit("rank %d: the allgather with SIGINT ignored is wrong" % rank)
    try:
        signal.raise_signal(signal.SIGINT)
        time.sleep(0.01)
    except KeyboardInterrupt:
        raise SystemExit("rank %d: SIGINT, ignored from C, raised after a stage" % rank)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def join(rank, size):
    want = float(size * (size + 1) // 2)
    if rank == 0:
        signalling(_capi.lib, "unisum_join", after=True)     # a Ctrl-C while it blocked
        interrupted_once("join()", us.join)
        last = us.join()
    else:
        # Runs while rank 0 has joined: its zeros stand in.
        got = us.allreduce(torch.full((3,), float(rank + 1)), op=us.Sum, name="joined")
        if not torch.equal(got, torch.full((3,), float(rank + 1))):
            raise SystemExit("rank %d: wrong allreduce while rank 0 joined %s" % (rank, got.tolist()))
        last = us.join()
    if last != size - 1:
        raise SystemExit("rank %d: join() returned %s, not %d" % (rank, last, size - 1))
    got = us.allreduce(torch.full((3,), float(rank + 1)), op=us.Sum, name="after")
    if not torch.equal(got, torch.full((3,), want)):
        raise SystemExit("rank %d: wrong allreduce after join %s" % (rank, got.tolist()))


def rejoin(rank):
    # A DistributedOptimizer whose gradients' push_pulls are in flight
    # (backward ran, step did not): rejoin() must forget them.
    model = torch.nn.Linear(4, 1, bias=False)
    opt = us.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                  named_parameters=model.named_parameters())
    model(torch.ones(2, 4)).sum().backward()
    t = torch.full((N,), float(rank + 1))
    h = us.push_pull_async(t, average=False, name="before")
    if rank == 0:
        undo = interrupting_answer("unisum_poll_timeout_into", True)
        interrupted_once("the push_pull's wait", lambda: us.synchronize(h))
        undo()
        undo = interrupting_answer("unisum_barrier_timeout_into", True)
        interrupted_once("the barrier", us.barrier)
        undo()
        # rejoin() itself, a SIGINT while it blocked in the C library: it
        # comes once rejoin() has done all of its work.
        signalling(_capi.lib, "unisum_rejoin", after=True)
        interrupted_once("rejoin()", us.rejoin)
        if opt._handles:
            raise SystemExit("rank 0: an interrupted rejoin() left the optimizer's handles of "
                             "the ended membership")
    else:
        us.synchronize(h)
        us.barrier()
        us.rejoin()                     # neither is called again
    rank, size = us.rank(), us.size()
    us.barrier()
    # A step of the new membership: every rank's gradient is 4 x ones.
    opt.zero_grad()
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    if not torch.equal(model.weight.grad, torch.full((1, 4), 2.0)):
        raise SystemExit("rank %d: gradient after rejoin() %s" % (rank, model.weight.grad.tolist()))
    for i in range(3):
        got = us.push_pull(torch.full((N,), float(i + 1)), average=False, name="after%d" % i)
        if not torch.equal(got, torch.full((N,), float((i + 1) * size))):
            raise SystemExit("rank %d: push_pull %d after rejoin() wrong: %s"
                             % (rank, i, got[:2].tolist()))


def speculated(rank):
    from unisum._horovod import slots as _horovod

    def rows(i, n=2):
        return torch.full((n, 3), float(100 * i + rank))
    for i in range(6):
        us.allgather(rows(i))
    if rank == 0:
        us.synchronize(us.allgather_async(rows(6)))
        us.synchronize(us.allgather_async(rows(7)))
        before = _horovod._spec_counts["started"]
        h = us.allgather_async(rows(8, 3))
        if us.local_size() == 1 and _horovod._spec_counts["started"] != before + 1:
            raise SystemExit("rank 0: call 8 did not speculate")
        undo = interrupting_answer("unisum_poll_timeout_into", False)
    else:
        h6 = us.allgather_async(rows(6))
        us.synchronize(us.allgather_async(rows(7)))
        h = us.allgather_async(rows(8))
        us.synchronize(h6)
        time.sleep(1)                   # rank 0 waits for the round meanwhile
        undo = interrupting("unisum_allgather_async")
    try:
        us.synchronize(h)
        raise SystemExit("rank %d: call 8 was not interrupted" % rank)
    except KeyboardInterrupt:
        pass
    undo()
    want = torch.cat([torch.full((3, 3), 800.0), torch.full((2, 3), 801.0)])
    got = us.synchronize(h)
    if not torch.equal(got, want):
        raise SystemExit("rank %d: wrong allgather %s" % (rank, got.tolist()))
    want = torch.cat([torch.full((2, 3), 900.0 + q) for q in range(2)])
    if not torch.equal(us.allgather(rows(9)), want):
        raise SystemExit("rank %d: the next allgather is wrong" % rank)


def main():
    mode = sys.argv[1]
    torch.set_num_threads(1)
    us.init()
    rank, size = us.rank(), us.size()
    if mode == "push_pull":
        push_pull(rank)
    elif mode == "allgather":
        allgather(rank, size)
    elif mode == "completed":
        completed(rank, size)
    elif mode == "stage":
        stage(rank, size)
    elif mode == "join":
        join(rank, size)
    elif mode == "rejoin":
        rejoin(rank)
        rank = us.rank()
    else:
        speculated(rank)
    us.barrier()
    print("rank %d: interrupted %s ok" % (rank, mode), flush=True)
    us.shutdown()


if __name__ == "__main__":
    main()
