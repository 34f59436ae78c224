"""The Work objects of the "unisum" process group, and the thread that
completes them (private).

Every operation of the group is started on the caller's thread, in the
caller's order (the workers of a machine must start theirs in one order:
see unisum.torch._core), as one or more unisum.torch handles whose
operations have no second stage.  Whoever claims it then waits for them
(``synchronize``, which releases the interpreter while it waits), runs what
finishes the operation (copies into the caller's tensors), and completes
its torch Future: a Python wait() on its own thread, or else the
completer, one daemon thread per process, in the order they were handed
to it.  A failure sets the future's exception.

torch 1.13 lets a Python ProcessGroup return a Python ``Work``, but C++
callers (DDP's constructor and reducer, ``_broadcast_coalesced``) then call
the C++ base class's ``wait()``, which never returns.  So the group returns
a Python ``Work`` to torch.distributed's Python functions (whose ``wait()``
raises the operation's error, honours the group's timeout, and returns to
the interpreter every 100 ms so that Ctrl-C reaches it), and the C++ work
that wraps the same future (``_create_work_from_future``) to everyone
else.  C++ waits on it without a timeout, and its ``wait()`` does not
raise: the completer fails the future once the group's timeout has
passed, and DDP reads the future's value, which raises the error.  (A
Ctrl-C reaches a C++ wait only when it ends, as with gloo.)
"""

from __future__ import annotations

import datetime
import queue
import sys
import threading
import time
from typing import Any, Callable, List, Optional

import torch
from torch._C._distributed_c10d import Work, _create_work_from_future
from torch.futures import Future

from unisum._capi import UnisumError
from unisum.torch._core import _nap
from unisum.torch.ops import poll, synchronize

_SLICE_S = 0.1      # a Python wait returns to the interpreter this often


class Pending:
    """One operation of the group: its unisum.torch handles, what finishes
    it, its result (a list of tensors; a communication hook's, a tensor)
    and its future."""

    __slots__ = ("what", "handles", "post", "result", "future", "done", "error", "started",
                 "claimed", "taken", "limit_s", "on_error")

    def __init__(self, what: str, handles: List[int], result: Any,
                 post: Optional[Callable[[], None]]) -> None:
        self.what = what
        self.handles = handles
        self.result = result
        self.post = post
        self.future: Future = Future()
        self.done = threading.Event()
        self.error: Optional[BaseException] = None
        self.started = time.monotonic()
        self.claimed = False    # a thread runs it (claim())
        self.taken = 0          # handles synchronized so far
        # For the completer: fail the future after this many seconds (the
        # group's timeout, for a C++ caller, whose wait has none); None:
        # wait as long as it takes.
        self.limit_s: Optional[float] = None
        # Called (on the completing thread) when the operation failed.
        self.on_error: Optional[Callable[[], None]] = None

    def claim(self) -> bool:
        """Makes the calling thread the one that runs this operation; False
        when another thread has (or it is done)."""
        with _claim_lock:
            if self.claimed or self.done.is_set():
                return False
            self.claimed = True
            return True

    def unclaim(self) -> None:
        """Gives the operation back (a wait that timed out or was
        interrupted): the completer finishes it."""
        with _claim_lock:
            self.claimed = False
        _completer.submit(self)

    def run(self, deadline: Optional[float] = None) -> None:
        """Waits for every handle (all of them, even after one failed: each
        must be taken), finishes, and completes the future.  By `deadline`
        (time.monotonic()), or raises TimeoutError with the rest still to
        take; a signal's exception leaves the same (run() goes on from
        there)."""
        error: Optional[BaseException] = self.error
        while self.taken < len(self.handles):
            h = self.handles[self.taken]
            try:
                if deadline is not None:
                    while not poll(h):
                        if time.monotonic() > deadline:
                            raise TimeoutError
                        _nap(h, int(_SLICE_S * 1000))
                synchronize(h)
            except UnisumError as e:
                error = error or e
            self.taken += 1
            self.error = error
        if error is None and self.post is not None:
            try:
                self.post()
            except BaseException as e:  # noqa: B902
                error = e
        self.complete(error)

    def complete(self, error: Optional[BaseException]) -> None:
        if error is not None and not isinstance(error, RuntimeError):
            error = RuntimeError("unisum: %s failed: %s" % (self.what, error))
        self.error = error
        if error is not None and self.on_error is not None:
            self.on_error()
        if error is None:
            self.future.set_result(self.result)
        else:
            self.future.set_exception(error)
        self.done.set()


class _Completer:
    """The daemon thread that completes the group's operations in order."""

    def __init__(self) -> None:
        self._queue: "queue.SimpleQueue[Pending]" = queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()

    def submit(self, p: Pending) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="unisum-completer",
                                                daemon=True)
                self._thread.start()
        self._queue.put(p)

    def _run(self) -> None:
        while True:
            p = self._queue.get()
            if not p.claim():
                continue
            try:
                p.run(None if p.limit_s is None else p.started + p.limit_s)
            except TimeoutError:
                p.complete(_timed_out(p.what, p.limit_s or 0))


def _timed_out(what: str, seconds: float) -> RuntimeError:
    return RuntimeError("unisum: %s timed out after %.3f s (the process group's timeout; the "
                        "operation stays in flight)" % (what, seconds))


_completer = _Completer()
_claim_lock = threading.Lock()
# Operations started from Python that nobody has asked to complete yet: a
# wait() runs one on its own thread (no hand-over to the completer and
# back); the next start, or get_future(), hands them to the completer.
_lazy: List[Pending] = []


def hand_over_lazy() -> None:
    """Hands every operation nobody has asked to complete to the completer."""
    with _claim_lock:
        lazy = list(_lazy)
        _lazy.clear()
    for p in lazy:
        if not p.claimed:
            _completer.submit(p)


class UnisumWork(Work):
    """What torch.distributed's Python functions get back (see the module
    docstring): wait() raises the operation's error as RuntimeError,
    raises when the group's timeout passes first, and returns to the
    interpreter every 100 ms."""

    def __init__(self, pending: Pending, timeout: datetime.timedelta) -> None:
        super().__init__()
        self._p = pending
        self._timeout = timeout

    def wait(self, timeout: datetime.timedelta = datetime.timedelta(0)) -> bool:
        limit = timeout if timeout and timeout.total_seconds() > 0 else self._timeout
        deadline = self._p.started + limit.total_seconds()
        p = self._p
        if p.claim():
            try:
                p.run(deadline)
            except TimeoutError:
                p.unclaim()
            except BaseException:
                p.unclaim()
                raise
        while not p.done.wait(_SLICE_S):
            if time.monotonic() > deadline:
                break
        if not p.done.is_set():
            raise _timed_out(p.what, limit.total_seconds())
        if p.error is not None:
            raise p.error
        return True

    def is_completed(self) -> bool:
        p = self._p
        if not p.done.is_set() and all(poll(h) for h in p.handles[p.taken:]) and p.claim():
            p.run()
        return p.done.is_set()

    def is_success(self) -> bool:
        return self._p.done.is_set() and self._p.error is None

    def exception(self) -> Optional[BaseException]:
        return self._p.error

    def get_future(self) -> Future:
        if not self._p.claimed:
            _completer.submit(self._p)
        return self._p.future

    def result(self) -> List[torch.Tensor]:
        self.wait()
        return self._p.result

    def source_rank(self) -> int:
        raise RuntimeError("unisum: source_rank() is for recv from any source, which unisum "
                           "does not offer")

    def synchronize(self) -> None:
        self.wait()


def python_caller() -> bool:
    """Whether the group's method running now was called by
    torch.distributed's own Python (distributed_c10d.py): then the Work
    goes to Python code.  Called by anything else (a Python frame that
    called into C++, which called the group), it goes to C++."""
    frame = sys._getframe(1)
    ours = (__file__.rsplit("/", 1)[0] + "/",)
    while frame is not None and frame.f_code.co_filename.startswith(ours):
        frame = frame.f_back
    if frame is None:
        return False
    return frame.f_code.co_filename.replace("\\", "/").endswith("distributed/distributed_c10d.py")


def start(p: Pending, timeout: datetime.timedelta, to_python: bool) -> Any:
    """The Work of operation `p`: a UnisumWork for Python callers
    (`to_python`, see python_caller()), which their wait() may run itself;
    else the C++ work wrapping its future, which the completer completes."""
    hand_over_lazy()
    if to_python:
        with _claim_lock:
            _lazy.append(p)
        return UnisumWork(p, timeout)
    p.limit_s = timeout.total_seconds()
    return _create_work_from_future(_to_completer(p))


def future_of(what: str, handles: List[int], result: Any,
              post: Optional[Callable[[], None]] = None) -> Future:
    """The future of an operation started as `handles` (a DDP
    communication hook's), completed by the completer with `result`."""
    hand_over_lazy()
    return _to_completer(Pending(what, handles, result, post))


def _to_completer(p: Pending) -> Future:
    """Hands `p` to the completer; returns its future as C++ must see it."""
    _completer.submit(p)
    return for_cpp(p.future)


def _unwrap(f: Future) -> Any:
    return f.value()


def for_cpp(future: Future) -> Future:
    """`future` as C++ must see it.  torch 1.13's Future.set_exception()
    stores the exception as the future's *value*, raised only by Python's
    wait() and value(); C++ (DDP's reducer) would take the exception object
    for its tensors, and crash.  A then() whose callback raises it gives
    the future C++ sees a real error instead."""
    return future.then(_unwrap)
