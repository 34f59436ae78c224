"""The state of unisum.torch and the machinery of its operations (private):
the tables of declared tensors and of operations in flight (_Op), second
stages run in call order, waits that return to the interpreter (Ctrl-C),
held signals, and the queries of the job (size, rank, local_rank,
local_size).  Every other module of the package imports from here; this
one imports none of them.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import threading
import time
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Tuple

import torch

from unisum import _capi
from unisum._capi import UnisumError

_DTYPES: Dict[torch.dtype, int] = {
    torch.float32: _capi.FLOAT32,
    torch.float64: _capi.FLOAT64,
    torch.float16: _capi.FLOAT16,
    torch.bfloat16: _capi.BFLOAT16,
    torch.int32: _capi.INT32,
    torch.int64: _capi.INT64,
}
_lock = threading.Lock()      # guards the tables below
_initialized = False
_tensors: Dict[str, Tuple[int, torch.dtype, int]] = {}   # name -> (tensor id, dtype, numel)
_specs: Dict[str, str] = {}     # name -> its compression spec, for the compressed ones
_ops: Dict[int, _Op] = {}     # handle -> _Op
_calls: Dict[int, int] = {}   # process set id -> its collectives named by order (_by_order)
_empty_handles = 0            # handles of empty tensors count down from -1
_WAIT_SLICE_MS = 100          # a wait returns to the interpreter this often
_kept = threading.local()     # .e: a signal's exception held back (_starting)


# Every DistributedOptimizer, to forget its operations when an elastic job
# re-forms (rejoin).
_optimizers: "weakref.WeakSet[Any]" = weakref.WeakSet()


# DistributedOptimizers with an exchange in flight (an overlapped DS-Sync
# step's group average, or one a Ctrl-C interrupted), held strongly: its
# buffers must outlive the operation even when the script drops the
# optimizer (a main() that returns); exit and shutdown() end it.
_flying: Set[Any] = set()


def _land_flying() -> None:
    """Ends every DistributedOptimizer's exchange in flight, loading what
    it brought (before a broadcast of parameters, a new optimizer,
    shutdown or exit).  Every member of a DS-Sync group started its
    average, so each ends, or fails naming a lost peer, in bounded time.

    Raises:
        UnisumError: The first that failed, once every one has ended.
    """
    first_error: Optional[UnisumError] = None
    for opt in list(_flying):
        try:
            opt._exchange_end()
        except UnisumError as e:
            first_error = first_error or e
    if first_error is not None:
        raise first_error


class _Op:
    """An operation in flight: keeps its tensors alive and knows how to
    finish (copy back into a non-contiguous destination, free a slot)."""

    __slots__ = ("c_handle", "send", "recv", "output", "done", "finish", "then", "job",
                 "failed", "error", "ready", "gate", "waiting", "settled")

    def __init__(self, c_handle: Optional[int], send: Optional[torch.Tensor],
                 recv: Optional[torch.Tensor], output: Any,
                 finish: Callable[[], None],
                 then: Optional[Callable[["_Op"], Optional[int]]] = None) -> None:
        self.c_handle = c_handle
        self.send = send        # the buffer the C library reads
        self.recv = recv        # the buffer the C library writes
        self.output = output    # what synchronize() returns
        self.done = False
        self.finish = finish    # called once when the operation completes
        # A second stage, started once the C operation is done (Horovod's
        # allgather waits for every rank's shape first): it may replace
        # send, recv, output and finish, and returns its C handle, or
        # None when nothing is left to wait for.
        self.then = then
        self.job: Any = None    # a CUDA tensor's push_pull (_cuda._Job), without c_handle
        self.failed = False     # set before finish() runs: the operation failed
        # How it failed, when a stage or a wait that was not its caller's
        # ended it: poll() and synchronize() raise it.
        self.error: Optional[BaseException] = None
        # With `then` (under _stage_lock): `ready` once the C operation is
        # done and its handle released; `gate()` waits until `then` may
        # run (None: whenever ready); `waiting` while a thread waits on
        # c_handle outside the lock (no one else polls it).
        self.ready = False
        self.gate: Optional[Callable[[], None]] = None
        self.waiting = False
        # Run by synchronize() once it has succeeded, before the handle is
        # gone (a Ctrl-C it raises leaves the handle there, for a retry).
        self.settled: Optional[Callable[[], None]] = None


# Second stages (_Op.then) run in call order, per process set, at points
# every rank's program reaches alike: synchronize(h) and poll(h) run every
# pending stage of h's set up to h's own (waiting for their small
# push_pulls, which need only every rank's call); join() and shutdown()
# all of them.  Never from a thread of their own or at a moment that
# depends on timing: the workers of a machine must start their operations
# in one order (the local reduce takes them in order), so ranks that
# synchronize in different orders still start every stage in call order.
_stage_lock = threading.Lock()
_pending: Dict[int, List[int]] = {}     # process set -> handles whose `then` has not run
_GATE_SLICE_S = 0.002


def _pend(handle: int, pset: int) -> None:
    """Files `handle` (its _Op has `then`) among set `pset`'s pending stages."""
    with _stage_lock:
        _pending.setdefault(pset, []).append(handle)


def _record(op: _Op, rc: int) -> None:
    """What the C library said of op's current handle (0: still in
    flight): > 0 done and released (ready for its next stage, or done),
    < 0 failed.  Caller holds _stage_lock."""
    if rc < 0:
        op.then, op.done = None, True
        op.error = _capi.error(rc, "unisum.torch: push_pull")
    elif rc > 0:
        if op.then is not None:
            op.ready = True
        else:
            op.done = True


# C handles whose answer (done, or failed: released either way) a signal's
# exception cut off, for the next _poll of that handle.  A membership
# numbers its operations afresh: rejoin() empties it.
_answers: Dict[int, int] = {}


def _poll(c_handle: int, timeout_ms: int) -> int:
    """unisum_poll_timeout (1 done, 0 in flight, < 0 failed) whose answer
    survives a signal's exception: CPython raises Ctrl-C's
    KeyboardInterrupt as a C call returns, before its value is kept, and a
    completion has released the handle by then, so polling it again would
    fail.  The C library writes the answer where this reads it after the
    exception too; the next _poll of the handle returns it."""
    kept = _answers.pop(c_handle, None)
    if kept is not None:
        return kept
    answer = ctypes.c_int(0)
    try:
        _capi.lib.unisum_poll_timeout_into(c_handle, timeout_ms, ctypes.byref(answer))
    except BaseException:
        if answer.value != 0:
            _answers[c_handle] = answer.value
        raise
    return answer.value


def _step(op: _Op, block: bool) -> bool:
    """Brings op's current C operation to its end (op.ready, or op.done):
    True once it has; without `block`, False while it is in flight.  Only
    one thread polls a handle (the C library releases it when done); a
    wait returns to the interpreter every _WAIT_SLICE_MS, so Ctrl-C can
    interrupt it and leaves the operation as it was."""
    while True:
        with _stage_lock:
            if op.done or (op.then is not None and op.ready):
                return True
            if op.c_handle is None:
                op.done = True
                return True
            mine = not op.waiting
            if mine and not block:
                _record(op, _poll(op.c_handle, 0))
                return op.done or op.ready
            if mine:
                op.waiting = True
                c_handle = op.c_handle
        if not mine:        # another thread waits on it
            if not block:
                return False
            time.sleep(_GATE_SLICE_S)
            continue
        _poll_for(op, c_handle, _WAIT_SLICE_MS)


@contextlib.contextmanager
def _starting(h: "ctypes.c_int64") -> Iterator[None]:
    """Around a C call that starts an operation and writes its handle into
    `h`.  A signal's exception (Ctrl-C's KeyboardInterrupt) comes right
    after the call returns, before its result is kept; when the operation
    started all the same, it runs, writing into its buffers, which must
    stay held (not go back to the result pool) and waitable.  Then the
    exception is held back and the caller goes on: it records the
    operation, then runs _raise_kept."""
    try:
        yield
    except BaseException as e:  # noqa: B902 (raised again by _raise_kept)
        if h.value == 0 or isinstance(e, Exception):
            raise
        _kept.e = e


def _raise_kept() -> None:
    """Raises the exception _starting held back, if any."""
    e = getattr(_kept, "e", None)
    if e is not None:
        _kept.e = None
        raise e


def _poll_for(op: _Op, c_handle: int, timeout_ms: int) -> None:
    """Waits at most timeout_ms on op's C handle, which this thread has
    taken (op.waiting), and records what the C library said, also when a
    signal's exception comes right after the call."""
    rc = 0
    try:
        rc = _poll(c_handle, timeout_ms)
    finally:
        with _stage_lock:
            op.waiting = False
            _record(op, rc)


def _nap(handle: int, timeout_ms: int) -> None:
    """Waits at most timeout_ms for the operation of `handle` (one whose
    stages are all run), keeping what the C library says (a completion
    releases its handle), unless a thread already waits on it."""
    with _lock:
        op = _ops.get(handle)
    if op is None:
        return
    with _stage_lock:
        if op.done or op.waiting or op.then is not None or op.c_handle is None:
            return
        op.waiting = True
        c_handle = op.c_handle
    _poll_for(op, c_handle, timeout_ms)


def _sigint_c_handler() -> Optional[int]:
    """The address of SIGINT's handler in the process's table (sigaction;
    a glibc struct sigaction begins with it), or None when unreadable.
    (Called on the main thread only, after import: one buffer serves.)"""
    try:
        if _libc.sigaction(_SIGINT, None, _sigaction_buf) != 0:
            return None
        return ctypes.c_void_p.from_buffer(_sigaction_buf).value or 0
    except (AttributeError, OSError, ctypes.ArgumentError):
        return None


_libc = ctypes.CDLL(None, use_errno=True)
_sigaction_buf = ctypes.create_string_buffer(256)


# signal's functions without its enum conversions (12 a Horovod call, a
# tenth of its CPU): handlers are the same objects either way.
try:
    from _signal import getsignal as _getsignal, signal as _setsignal
except ImportError:     # not CPython
    _getsignal, _setsignal = signal.getsignal, signal.signal


_SIGINT = int(signal.SIGINT)


# The C handler through which CPython runs a Python-level SIGINT handler:
# a hold swaps only that one, never one a native library installed since.
_PY_SIGINT = _sigint_c_handler() if callable(_getsignal(_SIGINT)) else None


class _SigintHold:
    """Holds a Ctrl-C (SIGINT) that comes inside its `with` block for the
    Python handler it was for, which deliver() then runs (at the block's
    end, unless `later`): a second stage's plain Python code (reading the
    exchange, declaring a new layout), join() and rejoin() must not stop
    half-way, or a collective never starts here while the other ranks wait
    for it.  On the main thread only (where Python runs signal handlers),
    and only while a Python handler is SIGINT's (not SIG_IGN, SIG_DFL or a
    native library's)."""

    def __init__(self, later: bool = False) -> None:
        self.later = later
        self.old: Any = None
        self.came: List[Any] = []

    def __enter__(self) -> "_SigintHold":
        if threading.current_thread() is not threading.main_thread() or _PY_SIGINT is None:
            return self
        old = _getsignal(_SIGINT)
        if not callable(old) or _sigint_c_handler() != _PY_SIGINT:
            return self
        try:
            _setsignal(_SIGINT, lambda signum, frame: self.came.append(frame))
        except ValueError:      # not the main interpreter's main thread after all
            return self
        self.old = old
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.old is not None:
            try:
                _setsignal(_SIGINT, self.old)
            finally:
                # signal.signal() first runs the handlers of signals that
                # came; one that raised (SIGALRM's timeout, say) left the
                # hold's in place, which would swallow every Ctrl-C after.
                if _getsignal(_SIGINT) is not self.old:
                    _setsignal(_SIGINT, self.old)
        if not self.later:
            self.deliver()

    def deliver(self) -> None:
        """Runs the handler for a Ctrl-C that came during the hold, once."""
        if self.came and self.old is not None:
            frame, old = self.came[0], self.old
            self.came, self.old = [], None
            old(signal.SIGINT, frame)     # Python's default: KeyboardInterrupt


def _run_stage(op: _Op) -> _SigintHold:
    """Runs op's `then` (its C operation is done): op.c_handle becomes the
    stage's, or op is done (failed: op.error).  A Ctrl-C meanwhile is held
    until that is on record; the caller delivers it (the hold returned)
    once it has let go of _stage_lock, which it holds here."""
    hold = _SigintHold(later=True)
    with hold:
        step, op.then, op.ready = op.then, None, False
        assert step is not None
        try:
            c_handle = step(op)
        except BaseException as e:  # noqa: B902 (synchronize() raises it)
            op.error, op.done = e, True
            if not isinstance(e, Exception):
                raise
            return hold
        if c_handle is None:
            op.done = True
        else:
            op.c_handle = c_handle
    if c_handle is not None:
        _raise_kept()   # a Ctrl-C as the stage's operation started (off the main thread)
    return hold


def _stages_through(handle: int) -> None:
    """Runs, in call order, every pending stage of `handle`'s set up to
    and including its own, waiting for their small push_pulls and gates."""
    while True:
        with _stage_lock:
            line = next((v for v in _pending.values() if handle in v), None)
            if line is None:
                return
            first = line[0]
        with _lock:
            op = _ops.get(first)
        if op is not None and op.then is not None:
            _step(op, True)
            if op.then is not None and op.gate is not None:
                op.gate()
        held: Optional[_SigintHold] = None
        with _stage_lock:
            if line and line[0] == first:
                if op is not None and op.then is not None and op.ready:
                    held = _run_stage(op)
                if op is None or op.then is None:
                    line.pop(0)
        if held is not None:
            held.deliver()      # a Ctrl-C during the stage: the stage is on record


def _settle_stages() -> None:
    """Runs every pending stage (join(), shutdown())."""
    with _stage_lock:
        lasts = [v[-1] for v in _pending.values() if v]
    for handle in lasts:
        _stages_through(handle)


def _settle(handle: int, op: _Op) -> None:
    """Waits until op is done, its stages (and the earlier ones of its set)
    run; op.error says whether it failed."""
    while not op.done:
        if op.then is None:
            _step(op, True)
        else:
            _stages_through(handle)
            if op.then is None:
                continue
            with _stage_lock:       # not reached: a stage that left its line
                op.then, op.done = None, True
                op.error = UnisumError("unisum.torch: an operation's second stage was lost "
                                       "(interrupted while it started)", _capi.EINVAL)


# rejoin()'s hooks: each runs before the C library re-forms the job, and
# returns what must stay held until it has (or None).  A module above this
# one that keeps state of a membership registers its own
# (register_rejoin_hook), so rejoin reaches into none of them.
_rejoin_hooks: List[Callable[[], Any]] = []


def register_rejoin_hook(hook: Callable[[], Any]) -> None:
    """Runs hook() at every rejoin(), before the job re-forms (see above)."""
    _rejoin_hooks.append(hook)


def _require_init() -> None:
    """Raises UnisumError (ENOTINIT) unless init() has been called."""
    if not _initialized:
        raise UnisumError("unisum.torch: call init() first", _capi.ENOTINIT)


def size() -> int:
    """The number of workers in the job.

    Raises:
        UnisumError: When init() has not been called (``ENOTINIT``).
    """
    _require_init()
    return _capi.lib.unisum_size()


def rank() -> int:
    """This worker's rank in the job, from 0 to size() - 1.

    Raises:
        UnisumError: When init() has not been called (``ENOTINIT``).
    """
    _require_init()
    return _capi.lib.unisum_rank()


def local_rank() -> int:
    """This worker's rank among the workers of its machine, from 0 to
    local_size() - 1.

    Raises:
        UnisumError: When init() has not been called (``ENOTINIT``).
    """
    _require_init()
    return _capi.lib.unisum_local_rank()


def local_size() -> int:
    """The number of workers of the job on this machine.

    Raises:
        UnisumError: When init() has not been called (``ENOTINIT``).
    """
    _require_init()
    return _capi.lib.unisum_local_size()


def _wait(c_handle: int) -> int:
    """unisum_wait in slices of _WAIT_SLICE_MS: between them the interpreter
    runs its signal handlers, so Ctrl-C (KeyboardInterrupt) or
    pytest-timeout's SIGALRM reach a rank blocked here; the operation then
    stays in flight.  Returns 0 or the negative error."""
    while True:
        rc = _poll(c_handle, _WAIT_SLICE_MS)
        if rc != 0:
            return 0 if rc > 0 else rc


def _register(op: _Op, done: bool = False) -> int:
    """Files an operation under a handle of its own (the C handle when there
    is one) and returns the handle."""
    global _empty_handles
    op.done = done
    with _lock:
        if op.c_handle is None:
            _empty_handles -= 1
            handle = _empty_handles
        else:
            handle = op.c_handle
        _ops[handle] = op
    return handle


def _take(handle: int) -> _Op:
    """The operation filed under `handle`; UnisumError (EINVAL) when there
    is none."""
    with _lock:
        op = _ops.get(handle)
    if op is None:
        raise UnisumError("unisum.torch: unknown or already synchronized handle %r" % (handle,),
                          _capi.EINVAL)
    return op
