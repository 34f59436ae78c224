"""unisum for PyTorch, with the names of byteps.torch and horovod.torch.

    import unisum.torch as us

    us.init()
    model = ...
    optimizer = us.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    us.broadcast_parameters(model.state_dict(), root_rank=0)
    us.broadcast_optimizer_state(optimizer, root_rank=0)
    for batch in shard_of_the_data:
        optimizer.zero_grad()
        loss_fn(model(batch)).backward()     # gradients are pushed as they appear
        optimizer.step()                     # waits for the sums, then steps

Tensors live on the CPU (the build of torch this targets has no GPU).  A
name maps to one dtype and element count on every worker; the keys come
from names, so workers may declare and push in any order.  Every failure
raises :class:`unisum.UnisumError` carrying the C library's message.

Choices where the references differ:

* A collective the caller does not name (``push_pull`` without a name,
  each ``broadcast_parameters``, ``broadcast_object`` and
  ``broadcast_optimizer_state``) is named by its place in the sequence of
  such calls, as Horovod names unnamed operations: every worker must make
  them in the same order.  Its tensor is declared for that call and
  undeclared after it, so a worker whose tensor differs in shape or dtype
  fails at the declaration, together with every other worker, instead of
  waiting for a name nobody else uses; and a training loop never grows
  the set of tensors.  (Horovod's allgather and alltoall instead reuse a
  few tensors per kind, each declared for a layout the ranks have
  exchanged and checked first: see ``_horovod``'s slots.)
* Every wait (``synchronize``, ``barrier``, the broadcasts) returns to the
  interpreter every 100 ms, so Ctrl-C raises KeyboardInterrupt in a rank
  blocked there (the operation stays in flight).
* ``DistributedOptimizer(backward_passes_per_step=k)`` sums the gradients of
  the k passes locally (as Horovod does: scale the loss by 1/k for a mean)
  and averages over workers.
* Each gradient's priority comes from its parameter's position (the first
  layer's gradients first), unlike BytePS, which gives every PyTorch
  gradient priority 0.
* With several workers on a machine, ``DistributedOptimizer`` puts every
  gradient in the worker's shared arena (``unisum.torch.zeros_like``, the C
  library's ``unisum_alloc``) before the first backward, so the other
  workers of the machine read and write it directly: autograd accumulates
  into an existing ``.grad`` in place.  A parameter whose first gradient
  turns out sparse (``nn.Embedding(sparse=True)``) gives its home up as
  that gradient arrives, and its gradients are summed as Horovod sums
  sparse ones.  ``shared_gradients=False`` keeps PyTorch's own memory.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import ctypes
import math
import os
import pickle
import queue
import signal
import threading
import time
import warnings
import weakref
from typing import (Any, Callable, Dict, Iterable, Iterator, List, Optional,
                    Sequence, Set, Tuple, TypeVar, Union, cast)

import numpy
import torch

from unisum import _capi
from unisum._capi import UnisumError
from unisum.torch.compression import Compression, Compressor

__all__ = [
    "init", "shutdown", "size", "rank", "local_rank", "local_size", "declare",
    "push_pull", "push_pull_", "push_pull_async", "push_pull_async_inplace", "poll",
    "push_pull_inplace", "byteps_push_pull", "suspend", "resume", "start_timeline",
    "stop_timeline",
    "synchronize", "broadcast_parameters", "broadcast_optimizer_state",
    "broadcast_object", "barrier", "DistributedOptimizer", "Compression", "UnisumError",
    "empty", "zeros_like", "get_stats", "membership_changed", "rejoin", "elastic",
]

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
_optimizer_counter = 0        # DistributedOptimizers made so far
_empty_handles = 0            # handles of empty tensors count down from -1
_WAIT_SLICE_MS = 100          # a wait returns to the interpreter this often
_kept = threading.local()     # .e: a signal's exception held back (_starting)
_joined = False               # the C library joined the job and has not left it
_init_pid = 0                 # the process that joined (a fork of it must not leave)
_at_exit_set = False          # _leave_at_exit is registered
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


def _require_init() -> None:
    """Raises UnisumError (ENOTINIT) unless init() has been called."""
    if not _initialized:
        raise UnisumError("unisum.torch: call init() first", _capi.ENOTINIT)


def init(lazy: bool = True, comm: Any = None, process_sets: Any = None) -> None:
    """Joins the job described by the environment (UNISUM_* or the BytePS
    DMLC_* names); under `unisum launch` everything is already set.

    Blocks until the whole job has registered.  A second call, before
    shutdown(), does nothing; after shutdown() it resumes the same job with
    the same rank, as Horovod allows.

    Args:
        lazy: BytePS's keyword; unisum always joins here (its servers and
            scheduler need no lazy start), so either value does the same.
        comm: Horovod's MPI communicator or list of ranks; unisum runs
            every rank of its job, so only None (or every rank) is taken.
        process_sets: Horovod's: a list of ProcessSets (or rank lists) to
            add now (add_process_set), or "dynamic" (sets are always
            dynamic in unisum).

    Raises:
        UnisumError: When the C library cannot join the job: a missing or
            invalid setting (``ECONFIG`` names the variable), a scheduler or
            server that cannot be reached, a failed authentication, a
            timeout.
        ValueError: For a `comm` that is not every rank.
    """
    del lazy
    _join()
    _pick_device()
    if comm is not None and sorted(comm) != list(range(size())):
        raise ValueError("unisum.torch.init: comm=%r: a unisum job runs all of its ranks; "
                         "use a process set (add_process_set) for a subgroup" % (comm,))
    if process_sets is not None and process_sets != "dynamic":
        from unisum import _horovod
        for ps in process_sets:
            _horovod.add_process_set(ps)


def _pick_device() -> None:
    """With several GPUs, this process's current device is the one of its
    local rank ($LOCAL_RANK, which torchrun and `unisum launch` set, else
    local_rank()), modulo their number, as torchrun users expect; with one,
    every process of the machine shares it."""
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        return
    env = os.environ.get("LOCAL_RANK", "")
    lr = int(env) if env.isdigit() else local_rank()
    torch.cuda.set_device(lr % torch.cuda.device_count())


def _join() -> None:
    """init()'s joining."""
    global _initialized, _joined, _init_pid, _at_exit_set
    with _lock:
        if _initialized:
            return
        if not _joined:
            _capi.check(_capi.lib.unisum_init(), "unisum.torch.init")
            _joined = True
            _init_pid = os.getpid()
        _initialized = True
        if not _at_exit_set:
            atexit.register(_leave_at_exit)
            _at_exit_set = True


def _leave_at_exit() -> None:
    """At interpreter exit, leaves the job (unisum_shutdown), so that a
    script ends its job normally whether or not it called shutdown()
    (BytePS's and Horovod's examples do not).  Only when no operation is
    in flight: one that is waits on other workers, and leaving would hang
    the exit; the process then ends without a goodbye and the job fails
    naming it."""
    global _joined
    if not _joined or os.getpid() != _init_pid:
        return
    try:
        _land_flying()      # a DS-Sync optimizer's last group average
    except UnisumError:
        return
    with _lock:
        pending = [op for op in _ops.values() if not op.done]
    for op in pending:
        if op.job is not None:
            from unisum import _cuda
            if not _cuda.wait(op.job, 0)[0]:
                return      # a CUDA push_pull, its C operation still to start or end
        elif op.then is not None:
            return          # a stage still to run: the others may wait on it
        elif op.c_handle is not None:
            rc = _poll(op.c_handle, 0)
            if rc == 0:
                return
            op.done = True
    with _lock:
        _joined = False
        _ops.clear()
    # A failure here was the job's, reported where it happened.
    _capi.lib.unisum_shutdown()


def shutdown() -> None:
    """Waits for operations in flight and stops using the job: every handle
    is forgotten, and every call but init() raises until init() resumes
    the same job (as Horovod allows).  The process leaves the job for good
    when it exits, also when it never calls shutdown(), as BytePS's and
    Horovod's scripts do not.  Without init(), or a second time, it does
    nothing.

    Raises:
        UnisumError: When an operation that was still in flight failed.
    """
    global _initialized
    # A DS-Sync optimizer's group average in flight, loaded.
    dssync_error: Optional[BaseException] = None
    if _initialized:
        try:
            _land_flying()
        except UnisumError as e:
            dssync_error = e
    # A CUDA tensor's push_pull waits on a C operation of its own (_cuda):
    # those end first, their threads still seeing the C operations.
    with _lock:
        cuda_ops = [(h, op) for h, op in _ops.items() if op.job is not None] if _initialized else []
    cuda_error: Optional[BaseException] = None
    for h, op in cuda_ops:
        from unisum import _cuda
        _cuda.wait_end(op.job, _WAIT_SLICE_MS / 1000.0)
        try:
            _cuda_end(h, op)
        except UnisumError as e:
            cuda_error = cuda_error or e
    with _lock:
        if not _initialized:
            return
        _initialized = False
        ops = sorted(((h, op) for h, op in _ops.items() if op.job is None),
                     key=lambda kv: kv[0])
    _pool_drop()
    # Every operation to its end, every stage run (the other ranks' ops
    # may wait on them), in the order they began; then each is finished
    # once, also those done but never synchronized.
    for h, op in ops:
        _settle(h, op)
    with _stage_lock:
        _pending.clear()
    with _lock:
        for h, _ in ops:
            _ops.pop(h, None)
    first_error: Optional[BaseException] = None
    for _, op in ops:
        op.failed = op.error is not None
        op.finish()
        first_error = first_error or op.error
    if first_error is not None:
        raise UnisumError("unisum.torch.shutdown: an operation in flight failed: %s"
                          % first_error, getattr(first_error, "code", _capi.EINVAL))
    if cuda_error is not None:
        raise cuda_error
    if dssync_error is not None:
        raise dssync_error


def membership_changed() -> bool:
    """Elastic jobs (``unisum launch --elastic``): whether this worker
    should call :func:`rejoin`: its membership ended (a worker was lost,
    the job re-forms) or workers wait to join.  ``elastic.State.commit()``
    polls it.

    Raises:
        UnisumError: When the job failed, or before init().
    """
    _require_init()
    return _capi.check(_capi.lib.unisum_membership_changed(),
                       "unisum.torch.membership_changed") == 1


def rejoin() -> None:
    """Elastic jobs: leaves the ended membership and joins the new one
    (blocking until it has formed; asks the scheduler to re-form when it
    has not, taking in the workers that wait).  rank() and size() change;
    every operation in flight and every declared tensor is forgotten, and
    DistributedOptimizers start their next step afresh.  The model's state
    is the caller's: ``elastic.run`` restores and broadcasts it.

    Raises:
        UnisumError: When the job is not elastic, or failed (fewer workers
            left than ``--min-workers``).
    """
    _require_init()
    # unisum_rejoin blocks until the job has re-formed (a Ctrl-C cannot
    # stop it), and what follows it must all run: a Ctrl-C comes after.
    with _SigintHold():
        _rejoin()


def _rejoin() -> None:
    """rejoin()'s work."""
    global _barrier_ended
    with _stage_lock:
        _pending.clear()
    with _lock:
        pending = list(_ops.values())
        _ops.clear()
        _tensors.clear()
        _specs.clear()
        _calls.clear()
        _answers.clear()
        _barrier_ended = False      # of the ended membership: not the next barrier()
    from unisum import _horovod
    _horovod._join_kept = None
    # Held until unisum_rejoin has ended every operation: the speculative
    # rounds' buffers (the C library may still write into them).
    held = _horovod._slots_forget(rejoin=True)
    if torch.cuda.is_available():
        from unisum import _cuda
        _cuda.forget()
    # The C library waits for every operation (each failed) and joins anew;
    # the CUDA threads' jobs in flight are of the ended membership, and make
    # no C call while it does (_cuda's gate).
    if torch.cuda.is_available():
        from unisum import _cuda
        with _cuda.new_generation():
            rc = _capi.lib.unisum_rejoin()
    else:
        rc = _capi.lib.unisum_rejoin()
    for op in pending:
        if op.done and op.job is not None:
            continue    # a CUDA push_pull that ended: its threads finished it
        # Each finished once: failed when it had not ended (its C
        # operation failed with the membership), else as it ended.
        op.failed = not op.done or op.error is not None
        op.done = True
        op.finish()
    del held
    _capi.check(rc, "unisum.torch.rejoin")
    for opt in list(_optimizers):
        opt._unisum_reset()


def get_stats() -> Dict[str, Any]:
    """What this worker's pipeline has done since init(), as unisum.h's
    unisum_get_stats() says: ``operations`` (collectives completed),
    ``bytes_pushed`` and ``bytes_pulled`` (data to and from the servers),
    ``server_bytes`` (a list: what went to each server), ``local_bytes``
    (input summed from its machine's workers through shared memory),
    ``partitions_sent``, ``credit_bytes``, ``partition_bytes`` and
    ``max_inflight_bytes``.

    Raises:
        UnisumError: When init() has not been called (``ENOTINIT``).
    """
    _require_init()
    st = _capi.Stats()
    _capi.check(_capi.lib.unisum_get_stats(ctypes.byref(st)), "unisum.torch.get_stats")
    out: Dict[str, Any] = {name: getattr(st, name) for name, _ in st._fields_
                           if name not in ("server_bytes", "nservers")}
    out["server_bytes"] = list(st.server_bytes[:min(st.nservers, _capi.STATS_SERVERS)])
    return out


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


def barrier(process_set: Any = None) -> None:
    """Returns once every worker has called barrier() (with a Horovod
    process set: every member of it, by a push_pull among them).

    The wait returns to the interpreter every 100 ms, so a signal handler
    (Ctrl-C's KeyboardInterrupt) can interrupt it.

    Raises:
        UnisumError: When init() has not been called, or when the job
            failed.
    """
    _require_init()
    pset = _pset_of(process_set)
    if pset != 0:
        synchronize(_start(torch.zeros(1, dtype=torch.int32), False, None, 0, True, pset=pset))
        return
    global _barrier_ended
    if _barrier_ended:
        # The last call's barrier ended as a signal's exception cut it
        # off: this call is that one, already met (a new barrier would be
        # one ahead of every other worker's).
        _barrier_ended = False
        return
    # In slices, so that signal handlers run (see _wait).
    answer = ctypes.c_int(0)
    try:
        while _capi.check(_capi.lib.unisum_barrier_timeout_into(_WAIT_SLICE_MS,
                                                                ctypes.byref(answer)),
                          "unisum.torch.barrier") == 0:
            pass
    except BaseException:
        _barrier_ended = answer.value > 0
        raise


# barrier(): the barrier of the last call ended, but a signal's exception
# came as its C call returned (see _poll).
_barrier_ended = False


def _wait(c_handle: int) -> int:
    """unisum_wait in slices of _WAIT_SLICE_MS: between them the interpreter
    runs its signal handlers, so Ctrl-C (KeyboardInterrupt) or
    pytest-timeout's SIGALRM reach a rank blocked here; the operation then
    stays in flight.  Returns 0 or the negative error."""
    while True:
        rc = _poll(c_handle, _WAIT_SLICE_MS)
        if rc != 0:
            return 0 if rc > 0 else rc


def empty(*size: Union[int, Sequence[int]], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An uninitialised CPU tensor in this worker's shared arena
    (``unisum_alloc``): the other workers of the machine sum it with plain
    loads and stores, without the cross-memory-attach copy.  Ordinary memory
    when there is no such arena (one worker per machine, not initialised,
    arena full); either way it works the same and stays valid after
    shutdown().

    Args:
        *size: The shape, as integers (``empty(2, 3)``) or as one tuple,
            list or torch.Size (``empty((2, 3))``), as for torch.empty().
        dtype: The tensor's dtype.

    Raises:
        MemoryError: When neither the arena nor ordinary memory has room.
    """
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    shape = cast(Tuple[int, ...], size)
    numel = math.prod(shape)
    nbytes = numel * _itemsize(dtype)
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    ptr = _capi.lib.unisum_alloc(nbytes)
    if not ptr:
        raise MemoryError("unisum.torch.empty: no memory for %d bytes" % nbytes)
    return _tensor_at(ptr, nbytes, dtype, shape, _capi.lib.unisum_free, ptr)


def _tensor_at(ptr: int, nbytes: int, dtype: torch.dtype, shape: Tuple[int, ...],
               release: Callable[..., None], *args: Any) -> torch.Tensor:
    """A tensor of `shape` over the nbytes at address ptr; release(*args)
    runs once it and every view of it have died (not at exit, when
    tensors still live)."""
    buf = (ctypes.c_char * nbytes).from_address(ptr)
    weakref.finalize(buf, release, *args).atexit = False
    return torch.frombuffer(buf, dtype=dtype, count=math.prod(shape)).view(shape)


# Results of collectives that return a new tensor (Horovod's allreduce,
# allgather, reducescatter, alltoall) come from a pool of buffers that the
# results of earlier calls gave back when they died.  A fresh buffer of a
# few MiB or more is fresh pages from the kernel (glibc maps such blocks
# anew and unmaps them on free), and their first write costs page faults:
# 30 ms of a 64 MiB allgather's 0.5 s on the emulated cluster, every call.
# Smaller blocks come warm from malloc's heap anyway.  The pool keeps the
# sizes used last (least recently used go first) and is emptied by
# shutdown().
_POOL_MIN = 1 << 20         # bytes: below, torch.empty
_POOL_PER_SIZE = 4          # buffers kept of each size
_POOL_BYTES = 512 << 20     # kept in all
_pool_lock = threading.Lock()
_pool: "collections.OrderedDict[int, List[torch.Tensor]]" = collections.OrderedDict()
_pool_bytes = 0
# A dying result's finalizer may run on any thread, inside the garbage
# collector, even while that thread holds _pool_lock: it files its buffer
# only when it gets the lock at once, else leaves it here for the next
# _result() (SimpleQueue.put is safe there).
_pool_returned: "queue.SimpleQueue[torch.Tensor]" = queue.SimpleQueue()


def _pool_keep(backing: torch.Tensor) -> None:
    """Files `backing` for the next result of its size, evicting the least
    recently used sizes to stay within _POOL_BYTES (_pool_lock held)."""
    global _pool_bytes
    n = backing.numel()
    if n > _POOL_BYTES or len(_pool.get(n, ())) >= _POOL_PER_SIZE:
        return
    while _pool_bytes + n > _POOL_BYTES:
        size, free = next(iter(_pool.items()))
        free.pop()
        _pool_bytes -= size
        if not free:
            del _pool[size]
    _pool.setdefault(n, []).append(backing)
    _pool.move_to_end(n)
    _pool_bytes += n


def _pool_put(backing: torch.Tensor) -> None:
    """The finalizer of a pooled result: gives its buffer back."""
    if _pool_lock.acquire(blocking=False):
        try:
            _pool_keep(backing)
        finally:
            _pool_lock.release()
    else:
        _pool_returned.put(backing)


def _pool_drain(keep: bool) -> None:
    """Empties _pool_returned, filing its buffers when `keep` (_pool_lock
    held)."""
    while True:
        try:
            backing = _pool_returned.get_nowait()
        except queue.Empty:
            return
        if keep:
            _pool_keep(backing)


def _pool_take(nbytes: int) -> Optional[torch.Tensor]:
    """A kept buffer of nbytes, or None; files the returned ones first."""
    global _pool_bytes
    with _pool_lock:
        _pool_drain(True)
        free = _pool.get(nbytes)
        if not free:
            return None
        backing = free.pop()
        _pool_bytes -= nbytes
        if free:
            _pool.move_to_end(nbytes)
        else:
            del _pool[nbytes]
        return backing


def _pool_drop() -> None:
    """Lets every kept buffer go (shutdown)."""
    global _pool_bytes
    with _pool_lock:
        _pool.clear()
        _pool_bytes = 0
        _pool_drain(False)


_itemsizes: Dict[torch.dtype, int] = {}


def _itemsize(dtype: torch.dtype) -> int:
    """Bytes per element of `dtype` (a tensor made to ask costs 5 us)."""
    size = _itemsizes.get(dtype)
    if size is None:
        size = _itemsizes[dtype] = torch.empty((), dtype=dtype).element_size()
    return size


def _result(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised CPU tensor of `shape` for a collective's result, from
    the pool when it is large (see _POOL_MIN); its buffer goes back to the
    pool when the tensor and every view of it have died."""
    shape = tuple(shape)
    numel = math.prod(shape)
    nbytes = numel * _itemsize(dtype)
    if nbytes < _POOL_MIN:
        return torch.empty(shape, dtype=dtype)
    backing = _pool_take(nbytes)
    if backing is None:
        backing = torch.empty(nbytes, dtype=torch.uint8)
    return _tensor_at(backing.data_ptr(), nbytes, dtype, shape, _pool_put, backing)


def zeros_like(tensor: torch.Tensor) -> torch.Tensor:
    """A zeroed tensor of `tensor`'s shape and dtype in the shared arena
    (see empty()).

    Args:
        tensor: The tensor whose shape and dtype the new one takes; its
            values and device are not used.

    Raises:
        MemoryError: When neither the arena nor ordinary memory has room.
    """
    return empty(tuple(tensor.shape), dtype=tensor.dtype).zero_()


def _tensor_id(name: str, tensor: torch.Tensor, priority: int,
               compression: Optional[str] = None) -> int:
    """The C tensor id of `name`, declared on first use with the tensor's
    dtype and element count (and compressed by the spec `compression`)."""
    if tensor.device.type not in ("cpu", "cuda"):
        raise TypeError("unisum.torch: tensor '%s' is on %s; unisum sums CPU and CUDA tensors" % (
            name, tensor.device))
    return _declared(name, tensor.dtype, tensor.numel(), priority, tuple(tensor.shape),
                     compression=compression)


_MAX_DIMS = 16      # RDV_MAX_DIMS: more dimensions are declared by their count alone
_SET_TAG = "\x01"   # "<tag><set id><tag><name>": a process set's tensor (_in_set)


def _in_set(pset: int, name: str) -> str:
    """The internal name of tensor `name` of process set `pset` (0: the
    global set, whose names are the user's)."""
    return name if pset == 0 else "%s%d%s%s" % (_SET_TAG, pset, _SET_TAG, name)


def _pset_of(process_set: Any, member: bool = True) -> int:
    """The C id of a Horovod process set (None: the global set, 0); with
    `member`, raises ValueError unless this worker is in the set."""
    if process_set is None:
        return 0
    pid = getattr(process_set, "process_set_id", None)
    if pid is None:
        raise ValueError("unisum.torch: %s was not added with add_process_set(), or was "
                         "removed" % (process_set,))
    ranks = getattr(process_set, "ranks", None)
    if member and pid != 0 and ranks is not None and rank() not in ranks:
        raise ValueError("unisum.torch: rank %d is not in %s" % (rank(), process_set))
    return int(pid)


def _declared(name: str, dtype: torch.dtype, numel: int, priority: int,
              shape: Optional[Tuple[int, ...]] = None, sync: Optional[str] = None,
              compression: Optional[str] = None) -> int:
    """The C tensor id of `name`, declared on first use as dtype[numel],
    with its dimensions when `shape` gives them (then every worker must
    pass the same dimensions, not only as many elements), or in sync mode
    `sync` ("async", "ssp:S", "dssync:G"; unisum_declare_sync), or
    compressed by the spec `compression` (unisum_declare_ex)."""
    key = (dtype, numel)
    with _lock:
        known = _tensors.get(name)
        spec = _specs.get(name)
    if known is not None and (spec or None) != (compression or None):
        raise UnisumError(
            "unisum.torch: tensor '%s' was declared %s and is now used %s; give it another "
            "name" % (name, "compressed '%s'" % spec if spec else "uncompressed",
                      "compressed '%s'" % compression if compression else "uncompressed"),
            _capi.EMISMATCH)
    if known is not None:
        tid, dtype, numel = known
        if (dtype, numel) != key:
            raise UnisumError(
                "unisum.torch: tensor '%s' was declared as %s[%d] and is now used as %s[%d]; "
                "give tensors of another shape another name" % (name, dtype, numel, *key),
                _capi.EMISMATCH)
        return tid
    if dtype not in _DTYPES:
        raise TypeError("unisum.torch: %s tensors are not supported; use one of %s" % (
            dtype, ", ".join(str(d) for d in _DTYPES)))
    if compression is not None:
        rc = _capi.lib.unisum_declare_ex(name.encode(), _DTYPES[dtype], numel, int(priority),
                                         compression.encode())
    elif sync is not None:
        rc = _capi.lib.unisum_declare_sync(name.encode(), _DTYPES[dtype], numel, int(priority),
                                           sync.encode())
    elif name.startswith(_SET_TAG):
        _, pset, real = name.split(_SET_TAG, 2)
        dims_of = shape if shape is not None and 0 < len(shape) <= _MAX_DIMS else (numel,)
        dims = (ctypes.c_int64 * len(dims_of))(*dims_of)
        rc = _capi.lib.unisum_declare_in(int(pset), real.encode(), _DTYPES[dtype], len(dims_of),
                                         dims, int(priority))
    elif shape is not None and 0 < len(shape) <= _MAX_DIMS:
        dims = (ctypes.c_int64 * len(shape))(*shape)
        rc = _capi.lib.unisum_declare_shaped(name.encode(), _DTYPES[dtype], len(shape), dims,
                                             int(priority))
    else:
        rc = _capi.lib.unisum_declare(name.encode(), _DTYPES[dtype], numel, int(priority))
    tid = _capi.check(rc, "unisum.torch: declare")
    with _lock:
        _tensors[name] = (tid, dtype, numel)
        if compression:
            _specs[name] = compression
    return tid


def _sync_mode(sync: Optional[str]) -> str:
    """DistributedOptimizer's sync mode: `sync`, else UNISUM_SYNC, else
    BytePS's BYTEPS_ENABLE_ASYNC=1, else "sync" (the C library checked the
    variables at init())."""
    if sync is None:
        sync = os.environ.get("UNISUM_SYNC") or (
            "async" if "1" in (os.environ.get("UNISUM_ENABLE_ASYNC"),
                               os.environ.get("BYTEPS_ENABLE_ASYNC")) else "sync")
    def bounded(prefix: str, lo: int, hi: int) -> bool:
        rest = sync[len(prefix):] if isinstance(sync, str) and sync.startswith(prefix) else ""
        return rest.isascii() and rest.isdigit() and lo <= int(rest) <= hi

    if sync not in ("sync", "async") and not bounded("ssp:", 0, 0xffffff) and \
            not bounded("dssync:", 1, 65535):
        raise ValueError("unisum.torch: sync must be 'sync', 'async', 'ssp:S' (S a staleness "
                         "bound) or 'dssync:G' (G a group size), got %r" % (sync,))
    return sync


def declare(name: str, tensor: Optional[torch.Tensor] = None, priority: int = 0) -> None:
    """Declares `name`.  With a tensor, its dtype and size are fixed now;
    without, at its first push_pull (as byteps.torch.declare).

    Args:
        name: The tensor's name, the same on every worker.
        tensor: A tensor of the dtype and element count that `name` will
            carry, or None to leave both to the first push_pull.
        priority: The tensor's priority (higher is sent first); used only
            with a tensor.

    Raises:
        UnisumError: When init() has not been called, when `name` was
            already declared with another dtype or element count
            (``EMISMATCH``), or when the C library rejects the declaration.
        TypeError: When `tensor` is not on the CPU or has a dtype unisum
            does not sum.
    """
    _require_init()
    if tensor is not None:
        _tensor_id(name, tensor, priority)


def _shaped(name: str, tensor: torch.Tensor) -> str:
    """An internal name that also carries dtype and size (see
    _DistributedOptimizer._grad_name)."""
    return "%s.%s[%d]" % (name, str(tensor.dtype).replace("torch.", ""), tensor.numel())


def _by_order(kind: str, label: Optional[str] = None, pset: int = 0) -> str:
    """A name for a collective the caller did not name: its place in this
    process's sequence of such calls in process set `pset` (each set counts
    its own, so ranks of different sets stay in step on the global one),
    the same on every worker that makes the same calls in the same order
    (see the module docstring).  The tensors named so are one-shot:
    declared for the call, undeclared after it (_undeclare)."""
    with _lock:
        n = _calls[pset] = _calls.get(pset, 0) + 1
    return "%s.%d" % (kind, n) if label is None else "%s.%d.%s" % (kind, n, label)


def _undeclare(name: str) -> None:
    """Forgets the one-shot tensor `name` here, and everywhere once every
    worker has (unisum_undeclare)."""
    with _lock:
        known = _tensors.pop(name, None)
        _specs.pop(name, None)
    if known is not None:
        _capi.check(_capi.lib.unisum_undeclare(known[0]), "unisum.torch: undeclare '%s'" % name)


def _start(tensor: torch.Tensor, average: bool, name: Optional[str], priority: int,
           inplace: bool, scale: float = 1.0, flags: Optional[int] = None,
           pset: int = 0, compression: Optional[str] = None, raise_kept: bool = True) -> int:
    """Starts push_pull_async (or, `inplace`, push_pull_async_inplace) and
    returns the operation's handle; see push_pull_async.  Without
    `raise_kept`, a Ctrl-C as it started stays held for the caller's
    _raise_kept (a caller with more to put on record first).  The result is
    multiplied by `scale` when it completes (Horovod's postscale_factor).
    `flags`, when given, replaces `average` with the C call's flags
    (_capi.MIN, MAX, PRODUCT).  `pset`: the process set it runs in (its
    members alone; an average divides by their number).  `compression`:
    the spec `name` is declared with (unisum_declare_ex)."""
    _require_init()
    if not isinstance(tensor, torch.Tensor):
        raise TypeError("unisum.torch: push_pull takes a torch.Tensor, got %s" % type(tensor).__name__)
    if tensor.is_cuda:
        return _start_cuda(tensor, average, name, priority, inplace, scale, flags, pset,
                           compression)
    release: Optional[Callable[[], None]] = None
    if name is None:
        name = one_shot = _in_set(pset, _by_order("push_pull", pset=pset))

        def release() -> None:
            _undeclare(one_shot)
    else:
        name = _in_set(pset, name)
    try:
        # Declared even when empty: every worker's tensor is checked.
        tid = _tensor_id(name, tensor, priority, compression)
        if tensor.numel() == 0:
            # Nothing to sum: an operation that is already done.
            output = tensor if inplace else torch.empty_like(tensor)
            if release is not None:
                release()
            return _register(_Op(None, None, None, output, lambda: None), done=True)
        src = tensor.detach()
        send = src if src.is_contiguous() else src.contiguous()
        if inplace:
            recv = send
            output = tensor
        else:
            recv = output = _result(send.shape, send.dtype)

        def finish() -> None:
            if scale != 1.0:
                recv.copy_(_scaled(recv, scale))
            if inplace and recv.data_ptr() != src.data_ptr():
                src.copy_(recv.view_as(src))
            if release is not None:
                release()

        if flags is None:
            flags = _capi.AVERAGE if average else 0
        h = ctypes.c_int64(0)
        with _starting(h):
            _capi.check(_capi.lib.unisum_push_pull_async(tid, send.data_ptr(), recv.data_ptr(),
                                                         flags, ctypes.byref(h)),
                        "unisum.torch: push_pull")
    except BaseException:
        if release is not None and name in _tensors:
            release()
        raise
    handle = _register(_Op(h.value, send, recv, output, finish))
    if raise_kept:
        _raise_kept()
    return handle


def _start_cuda(tensor: torch.Tensor, average: bool, name: Optional[str], priority: int,
                inplace: bool, scale: float, flags: Optional[int], pset: int,
                compression: Optional[str]) -> int:
    """_start for a CUDA tensor (see _cuda's pipeline): declared here, in the
    caller's order; its device-to-host copy queued behind the current
    stream's work; the C push_pull of its staging buffer started by the
    starter thread once the copy has landed; the sum copied back on the
    second stream.  synchronize() makes the current stream wait for that
    copy.  The result lands on the tensor's own device."""
    from unisum import _cuda
    one_shot = name is None
    raw = _by_order("push_pull", pset=pset) if name is None else name
    wire = _in_set(pset, raw)
    src = tensor.detach()
    send = src if src.is_contiguous() else src.contiguous()
    _tensor_id(wire, send, priority, compression)   # a mismatch fails here, at once
    if inplace:
        output, dest = tensor, send
    else:
        output = dest = torch.empty_like(send, memory_format=torch.contiguous_format)
    if send.numel() == 0:
        if one_shot:
            _undeclare(wire)
        return _register(_Op(None, None, None, output, lambda: None), done=True)
    host = _cuda.staging(wire, send)
    try:
        copied = _cuda.copy_out(wire, send, host)
    except BaseException:
        _cuda.release(wire, drop=one_shot)
        if one_shot:
            _undeclare(wire)
        raise

    def start() -> int:
        return _start(host, average, raw, priority, True, scale, flags, pset, compression)

    def end_c(c_handle: int) -> None:
        try:
            synchronize(c_handle)
        finally:
            if one_shot:
                _undeclare(wire)

    def abort() -> None:
        if one_shot:
            _undeclare(wire)

    def nap(c_handle: int) -> None:
        _nap(c_handle, 1)

    def finish() -> None:
        _cuda.release(wire, drop=one_shot)
        if not op.failed and dest.data_ptr() != src.data_ptr() and output is tensor:
            src.copy_(dest.view_as(src))    # on the current stream, after the copy back

    op = _Op(None, send, dest, output, finish)
    op.job = _cuda.submit(_cuda._Job(send.device, copied, start, poll, nap, end_c,
                                     lambda: _cuda.copy_back(wire, host, dest), abort))
    return _register(op)


def _cuda_end(handle: int, op: _Op) -> Any:
    """The end of a CUDA push_pull that has ended (see _cuda): takes the
    handle, makes the current stream wait for the copy back, finishes;
    returns the output or raises the operation's error."""
    from unisum import _cuda
    _, event, err = _cuda.wait(op.job, 0)
    with _lock:
        _ops.pop(handle, None)
    op.done = True
    if err is None:
        torch.cuda.current_stream(op.output.device).wait_event(event)
    op.failed = err is not None
    finish, op.finish, op.job = op.finish, lambda: None, None    # no cycle through finish
    finish()
    if err is not None:
        raise err
    return op.output


def _scaled(tensor: torch.Tensor, factor: float) -> torch.Tensor:
    """tensor x factor in tensor's dtype, computed as Horovod does on the
    CPU: integers in float64 (then truncated), float16 in float32."""
    if not tensor.dtype.is_floating_point:
        return (tensor.to(torch.float64) * factor).to(tensor.dtype)
    if tensor.dtype in (torch.float16, torch.bfloat16):
        return (tensor.to(torch.float32) * factor).to(tensor.dtype)
    return tensor * factor


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


def push_pull_async(tensor: torch.Tensor, average: bool = True, name: Optional[str] = None,
                    version: int = 0, priority: int = 0) -> int:
    """Starts summing `tensor` over all workers into a new tensor (divided by
    size() when `average`); returns a handle for poll() / synchronize().

    Args:
        tensor: The CPU tensor to sum, of a dtype unisum sums (float32,
            float64, float16, bfloat16, int32, int64).  The C library reads
            it (and, in place, writes it) until the operation completes, so
            leave it alone until then.
        average: Divide the sum by size() (a mean over the workers) when
            true; the plain sum when false.
        name: The tensor's name, the same on every worker; it keeps one
            dtype and element count for the whole job.  None names the call
            by its place in this process's sequence of unnamed collectives,
            so every worker must then make those calls in the same order.
        version: BytePS's keyword, for its asynchronous mode; taken and
            unused (every round of the lock-step mode is its own version).
        priority: Higher is sent first when several operations are in
            flight; used when `name` is declared (its first use).

    Raises:
        TypeError: When `tensor` is not a torch.Tensor, is not on the CPU,
            or has a dtype unisum does not sum.
        UnisumError: When init() has not been called, when `name` was
            declared with another dtype or element count here or on another
            worker (``EMISMATCH``), or when the C library cannot start the
            operation (such as ``EBUSY`` while the same name has one in
            flight).
    """
    del version
    return _start(tensor, average, name, priority, inplace=False)


def push_pull_async_inplace(tensor: torch.Tensor, average: bool = True,
                            name: Optional[str] = None, version: int = 0,
                            priority: int = 0) -> int:
    """As push_pull_async, writing the result into `tensor` itself.

    Returns a handle for poll() / synchronize(); synchronize() then returns
    `tensor`.  The arguments and the exceptions are those of
    push_pull_async().
    """
    del version
    return _start(tensor, average, name, priority, inplace=True)


def _take(handle: int) -> _Op:
    """The operation filed under `handle`; UnisumError (EINVAL) when there
    is none."""
    with _lock:
        op = _ops.get(handle)
    if op is None:
        raise UnisumError("unisum.torch: unknown or already synchronized handle %r" % (handle,),
                          _capi.EINVAL)
    return op


def poll(handle: int) -> bool:
    """True once the operation is done (then synchronize() returns at once).

    Does not wait for the operation: False while it is still in flight.
    A gathering collective's second stage (and those before it) starts
    here, which may wait for its small push_pull, as synchronize() does.

    Args:
        handle: A handle from push_pull_async() or
            push_pull_async_inplace() that synchronize() has not taken yet.

    Raises:
        UnisumError: When `handle` is unknown or already synchronized
            (``EINVAL``), or when the operation failed; after a failure the
            handle is gone.
    """
    op = _take(handle)
    if op.job is not None:
        from unisum import _cuda
        ended, _, err = _cuda.wait(op.job, 0)
        if ended and err is not None:
            _cuda_end(handle, op)   # raises it
        return ended
    # Its set's stages up to its own run here as in synchronize() (they may
    # wait for their small push_pulls): at a point of the program, never
    # at a moment that depends on timing.
    _stages_through(handle)
    done = op.then is None and _step(op, False) and op.done
    if done and op.error is not None:
        with _lock:
            _ops.pop(handle, None)
        op.failed = True
        op.finish()
        raise op.error
    return done


def synchronize(handle: int) -> torch.Tensor:
    """Waits for the operation and returns its output tensor.

    The output is the new tensor of push_pull_async(), or the tensor that
    push_pull_async_inplace() was given.  The handle is gone afterwards.  The
    wait returns to the interpreter every 100 ms, so Ctrl-C's
    KeyboardInterrupt can interrupt it; the operation and its handle then
    stay as they were.

    Args:
        handle: A handle from push_pull_async() or
            push_pull_async_inplace() that synchronize() has not taken yet.

    Raises:
        UnisumError: When `handle` is unknown or already synchronized
            (``EINVAL``), or when the operation failed (the C library's
            message says why).
    """
    op = _take(handle)
    if op.job is not None:
        # In slices, as _wait, so that signal handlers run.
        from unisum import _cuda
        _cuda.wait_end(op.job, _WAIT_SLICE_MS / 1000.0)
        return cast(torch.Tensor, _cuda_end(handle, op))
    # An operation that is not done has a C handle (only empty tensors have
    # none, and they are done from the start).
    _settle(handle, op)
    err = op.error
    if err is None and op.settled is not None:
        settled, op.settled = op.settled, None
        settled()
    with _lock:
        _ops.pop(handle, None)
    op.failed = err is not None
    op.finish()
    if err is not None:
        raise err
    return op.output


def push_pull(tensor: torch.Tensor, average: bool = True, name: Optional[str] = None,
              version: int = 0, priority: int = 0,
              compression: Optional[Compressor] = None) -> torch.Tensor:
    """Sums `tensor` over all workers into a new tensor and returns it.

    push_pull_async() followed by synchronize(); `tensor` is left as it is.
    The arguments are push_pull_async()'s, and `compression`
    (Compression.none or Compression.fp16, as in BytePS: the tensor
    travels compressed and comes back in its own dtype).

    Raises:
        TypeError: As push_pull_async().
        UnisumError: As push_pull_async(), or when the operation fails.
    """
    if compression is not None and compression is not Compression.none:
        sent, ctx = compression.compress(tensor)
        return compression.decompress(push_pull(sent, average, name, version, priority), ctx)
    return synchronize(push_pull_async(tensor, average, name, version, priority))


def push_pull_(tensor: torch.Tensor, average: bool = True, name: Optional[str] = None,
               version: int = 0, priority: int = 0) -> torch.Tensor:
    """Sums `tensor` over all workers in place and returns it.

    push_pull_async_inplace() followed by synchronize().  The arguments are
    those of push_pull(), and so are the exceptions.
    """
    return synchronize(push_pull_async_inplace(tensor, average, name, version, priority))


push_pull_inplace = push_pull_      # BytePS's name


def byteps_push_pull(tensor: torch.Tensor, version: int = 0, priority: int = 0,
                     name: Optional[str] = None, is_average: bool = True) -> torch.Tensor:
    """BytePS's low-level form (its MXNet and TensorFlow plugins): sums
    (`is_average`: averages) `tensor` over all workers in place and returns
    it.  push_pull_() with BytePS's argument order."""
    return push_pull_(tensor, is_average, name, version, priority)


def suspend() -> None:
    """BytePS's suspend(): waits for the operations in flight and stops
    using the job until resume() (shutdown() keeps the process in it)."""
    shutdown()


def resume(num_workers: Optional[int] = None, num_servers: Optional[int] = None,
           global_rank: Optional[int] = None, context: Any = None) -> None:
    """BytePS's resume(): uses the job again after suspend() (init()).
    Only the job as it was.  BytePS also resumes at another size, its
    elastic training; unisum's elastic jobs change size another way, as
    Horovod's do: ``unisum launch --elastic`` adds and loses workers, and
    ``unisum.torch.elastic.run`` (or rejoin()) carries a training loop
    across each change.

    Raises:
        NotImplementedError: For a number of workers or servers, or a rank,
            other than the job's.
    """
    del context
    init()
    wanted = {"num_workers": (num_workers, size() // local_size()),
              "num_servers": (num_servers, None), "global_rank": (global_rank, rank())}
    for what, (asked, now) in wanted.items():
        if asked is not None and now is not None and int(asked) != now:
            raise NotImplementedError("unisum.torch.resume(%s=%s): the job has %s; resume() "
                                      "resumes the job as it was: for a job that changes size "
                                      "use `unisum launch --elastic` and "
                                      "unisum.torch.elastic.run (or rejoin())"
                                      % (what, asked, now))


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Horovod's: records every collective from now on into the Chrome
    trace-event JSON file `file_path` (unisum's timeline: QUEUE, PUSH, PULL
    and local reduce spans per partition) until stop_timeline().
    `mark_cycles` is taken and unused (unisum has no negotiation cycles).

    Raises:
        UnisumError: While a timeline is being written already (also the
            one UNISUM_TRACE_ON starts), or when the file cannot be written.
    """
    del mark_cycles
    _require_init()
    _capi.check(_capi.lib.unisum_timeline_start(os.fsencode(file_path)),
                "unisum.torch.start_timeline")


def stop_timeline() -> None:
    """Horovod's: ends the timeline start_timeline() began and completes
    its file."""
    _require_init()
    _capi.check(_capi.lib.unisum_timeline_stop(), "unisum.torch.stop_timeline")


def _broadcast_start(tensor: torch.Tensor, root_rank: int, name: Optional[str],
                     inplace: bool, one_shot: Optional[bool] = None, pset: int = 0) -> int:
    """Starts a broadcast of root's `tensor` into `tensor` itself (`inplace`)
    or a new tensor, and returns a handle for poll() / synchronize(), which
    returns the result.  `name` None names it by order; the name is
    undeclared after the call when it is `one_shot` (by default: when it was
    None).  Dtypes the C library does not sum (bool, uint8, int8, int16,
    complex) travel widened to int64 / float64, which carries them
    exactly.  `pset`: the process set it runs in (root_rank a member)."""
    _require_init()
    if not isinstance(tensor, torch.Tensor):
        raise TypeError("unisum.torch: broadcast takes a torch.Tensor, got %s" % type(tensor).__name__)
    if tensor.is_cuda:
        # Broadcasts set up training (parameters, optimizer state, objects):
        # through host memory, the host waiting for the copies.
        host = tensor.detach().to("cpu")
        h = _broadcast_start(host, root_rank, name, True, one_shot, pset)
        with _lock:
            op = _ops[h]
        first = op.finish

        def back() -> None:
            first()
            if op.failed:
                return
            if inplace:
                tensor.copy_(host)
            else:
                op.output = host.to(tensor.device)
        op.finish = back
        if inplace:
            op.output = tensor
        return h
    if one_shot is None:
        one_shot = name is None
    name = _in_set(pset, _by_order("broadcast", pset=pset) if name is None else name)
    src = tensor.detach()
    if src.dtype in _DTYPES:
        buf = src.contiguous() if inplace else src.clone(memory_format=torch.contiguous_format)
    elif src.dtype.is_complex:
        buf = torch.view_as_real(src.contiguous()).to(torch.float64)
    else:
        buf = src.to(torch.float64 if src.dtype.is_floating_point else torch.int64)
    # Where the result lands: the tensor itself, buf, or a new tensor.
    dest = src if inplace else buf if buf.dtype == src.dtype else torch.empty_like(src)
    output = tensor if inplace else dest

    def finish() -> None:
        if buf.data_ptr() != dest.data_ptr():
            dest.copy_(torch.view_as_complex(buf) if src.dtype.is_complex
                       else buf.reshape(dest.shape))
        if one_shot:
            _undeclare(name)

    # Declared even when empty: every worker's shape is checked.
    tid = _tensor_id(name, buf, 0)
    if buf.numel() == 0:
        finish()
        return _register(_Op(None, None, None, output, lambda: None), done=True)
    h = ctypes.c_int64(0)
    rc = 0
    with _starting(h):
        rc = _capi.lib.unisum_broadcast_async(tid, buf.data_ptr(), int(root_rank),
                                              ctypes.byref(h))
    if rc != 0 and one_shot:
        _undeclare(name)
    _capi.check(rc, "unisum.torch: broadcast")
    handle = _register(_Op(h.value, buf, buf, output, finish))
    _raise_kept()
    return handle


def _broadcast_(tensor: torch.Tensor, root_rank: int, name: str, pset: int = 0) -> None:
    """Overwrites `tensor` with root's tensor of the one-shot name `name`
    (_by_order).  Interrupted (KeyboardInterrupt), the broadcast stays in
    flight, its buffers kept by its handle."""
    synchronize(_broadcast_start(tensor, root_rank, name, inplace=True, one_shot=True, pset=pset))


def broadcast_parameters(params: Union[Dict[str, torch.Tensor],
                                       Iterable[Tuple[str, torch.Tensor]]],
                         root_rank: int) -> None:
    """Copies root's parameters to every worker, in place.  `params` is a
    state_dict() or named_parameters() (or any (name, tensor) pairs).

    The tensors travel in the order of their names, so every worker must
    pass the same names with tensors of the same shapes.  Tensors of any
    dtype and layout on the CPU work (dtypes unisum does not sum travel
    widened, exactly).  Every worker must make its calls of
    broadcast_parameters, broadcast_object and broadcast_optimizer_state,
    and its unnamed push_pulls, in the same order.

    Args:
        params: A dict of names to tensors (a state_dict()), or an iterable
            of (name, tensor) pairs (named_parameters()).
        root_rank: The rank whose tensors every worker receives.

    Raises:
        TypeError: When a value is not a torch.Tensor, or a tensor is not
            on the CPU.
        UnisumError: When init() has not been called, when the workers'
            tensors of a name differ in shape or dtype (``EMISMATCH``), or
            when a broadcast fails.
    """
    _require_init()
    _land_flying()      # a DS-Sync average in flight would land on top later
    items = params.items() if isinstance(params, dict) else params
    call = _by_order("broadcast_parameters")
    for name, p in sorted(items, key=lambda kv: kv[0]):
        if not isinstance(p, torch.Tensor):
            raise TypeError("unisum.torch: broadcast_parameters: '%s' is not a tensor" % name)
        _broadcast_(p, root_rank, "%s.%s" % (call, name))


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None,
                     process_set: Any = None) -> Any:
    """Returns root's `obj` on every worker (pickled; any size).

    The root gets its own `obj` back; every other worker gets an unpickled
    copy of it.  Every worker must make its calls of broadcast_object,
    broadcast_parameters and broadcast_optimizer_state, and its unnamed
    push_pulls, in the same order.

    Args:
        obj: On the root, any object that pickle can serialise; ignored on
            the other workers (None will do).
        root_rank: The rank whose `obj` every worker receives.
        name: A label added to the internal name of the call (which its
            place in the sequence of such calls fixes), the same on every
            worker; None for none.
        process_set: A Horovod process set (add_process_set) whose members
            alone take part, root_rank one of them; None for every worker.

    Raises:
        UnisumError: When init() has not been called, or when a broadcast
            fails (such as workers that disagree on `name`).
        pickle.PicklingError: On the root, when `obj` cannot be pickled
            (or whatever else pickle.dumps raises for it); the other workers
            raise what pickle.loads raises when they cannot unpickle it.
    """
    _require_init()
    pset = _pset_of(process_set)
    name = _by_order("broadcast_object", name, pset)
    is_root = rank() == root_rank
    if is_root:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        length = torch.tensor([len(data)], dtype=torch.int64)
    else:
        length = torch.zeros(1, dtype=torch.int64)
    _broadcast_(length, root_rank, name + ".len", pset)
    n = int(length.item())
    words = (n + 3) // 4
    if is_root:
        payload = torch.zeros(words, dtype=torch.int32)
        payload.numpy().view(numpy.uint8)[:n] = numpy.frombuffer(data, dtype=numpy.uint8)
    else:
        payload = torch.zeros(words, dtype=torch.int32)
    if words > 0:
        _broadcast_(payload, root_rank, name + ".data", pset)
    return obj if is_root else pickle.loads(payload.numpy().view(numpy.uint8)[:n].tobytes())


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int) -> None:
    """Makes every worker's optimizer state equal root's: the state tensors
    (momentum buffers, Adam moments, step counts) and the scalars of every
    parameter group (lr, momentum, ...).  Works for stateless optimizers.

    The other workers load root's state with optimizer.load_state_dict(); the
    root's optimizer is left as it is.  Every worker must make its calls of
    broadcast_optimizer_state, broadcast_parameters and broadcast_object,
    and its unnamed push_pulls, in the same order.

    Args:
        optimizer: This worker's optimizer (a DistributedOptimizer or any
            torch.optim.Optimizer) over the same parameters as on the other
            workers.
        root_rank: The rank whose state every worker receives.

    Raises:
        UnisumError: When init() has not been called, or when a broadcast
            fails (such as a state tensor whose shape differs between the
            workers).
        ValueError: When root's state does not fit this worker's optimizer
            (from optimizer.load_state_dict(), such as a different number of
            parameter groups).
    """
    _require_init()
    _land_flying()
    # A CrossBarrier: the DistributedOptimizer it wraps.
    optimizer = getattr(optimizer, "_unisum_wrapped", optimizer)
    if len(optimizer.state_dict()["state"]) == 0:
        # As Horovod: an optimizer that has not stepped yet gets its state
        # made by one step on zero gradients, so that the state tensors
        # exist to be broadcast.  The wrapped optimizer's own step: a
        # DistributedOptimizer's would sum gradients, which only works when
        # every rank steps.
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad and p.grad is not None and not p.grad.is_sparse:
                    p.grad.zero_()      # keeps a gradient's home (the shared arena)
                elif p.requires_grad:
                    p.grad = p.data.new(p.size()).zero_()
                    if isinstance(optimizer, torch.optim.SparseAdam):
                        p.grad = p.grad.to_sparse()
        # The parameters stay as they are (Horovod lets weight decay move
        # them here, away from the root's).
        kept = [p.detach().clone() for group in optimizer.param_groups for p in group["params"]]
        if type(optimizer).__dict__.get("synchronize") is _DistributedOptimizer.synchronize:
            super(type(optimizer), optimizer).step()  # type: ignore[misc]
        else:
            optimizer.step()
        with torch.no_grad():
            for p, k in zip([p for group in optimizer.param_groups for p in group["params"]], kept):
                p.copy_(k)
    state = optimizer.state_dict()
    # Root sends the layout (with tensors replaced by their shape and dtype);
    # then every tensor travels as a tensor.
    layout: Dict[Any, Dict[str, Tuple[Any, ...]]] = {}
    tensors: List[torch.Tensor] = []
    for pid, pstate in sorted(state["state"].items()):
        entry: Dict[str, Tuple[Any, ...]] = {}
        for k, v in sorted(pstate.items()):
            if isinstance(v, torch.Tensor):
                entry[k] = ("tensor", tuple(v.shape), v.dtype, len(tensors))
                tensors.append(v)
            else:
                entry[k] = ("value", v)
        layout[pid] = entry
    call = _by_order("broadcast_optimizer_state")
    received = broadcast_object({"layout": layout, "param_groups": state["param_groups"]},
                                root_rank, name=call)
    is_root = rank() == root_rank
    new_state: Dict[Any, Dict[str, Any]] = {}
    for pid, entry in received["layout"].items():
        new_state[pid] = {}
        for k, desc in entry.items():
            if desc[0] == "value":
                new_state[pid][k] = desc[1]
                continue
            _, shape, dtype, index = desc
            t = tensors[index] if is_root else torch.zeros(shape, dtype=dtype)
            _broadcast_(t, root_rank, "%s.%s.%s" % (call, pid, k))
            new_state[pid][k] = t
    if not is_root:
        optimizer.load_state_dict({"state": new_state, "param_groups": received["param_groups"]})


class _DistributedOptimizer(torch.optim.Optimizer):
    """Mixed into the user's optimizer class by DistributedOptimizer()."""

    _unisum_class: Any      # the class DistributedOptimizer() made (set there)

    def __init__(self, params: Iterable[Dict[str, Any]],
                 named_parameters: Optional[Iterable[Tuple[str, torch.Tensor]]],
                 compression: Compressor, backward_passes_per_step: int,
                 shared_gradients: bool = True, reduce: Optional[Dict[str, Any]] = None) -> None:
        # self._unisum_class is the class DistributedOptimizer() made, whose
        # base is the user's optimizer class: its constructor has defaults
        # for everything but the parameters, which torch.optim.Optimizer's
        # has not.
        super(self._unisum_class, self).__init__(params)  # type: ignore[call-arg]
        # An earlier optimizer's exchange in flight, perhaps on these same
        # parameters' tensors: it lands first.
        _land_flying()
        self._compression = compression
        self._passes = backward_passes_per_step
        # How gradients are reduced (DistributedOptimizer's op,
        # gradient_predivide_factor, sparse_as_dense, process_set).
        reduce = reduce or {}
        self._sum = bool(reduce.get("sum", False))
        self._predivide = float(reduce.get("predivide", 1.0))
        self._sparse_as_dense = bool(reduce.get("sparse_as_dense", False))
        self._process_set = reduce.get("process_set")   # Horovod's object, or None
        self._sparse: Set[torch.Tensor] = set()     # parameters seen with a sparse gradient
        self._spec: Optional[str] = reduce.get("compression")
        self._pset = int(reduce.get("pset", 0))
        self._members = int(reduce.get("members", size()))
        self._included = bool(reduce.get("included", True))
        all_params = [p for group in self.param_groups for p in group["params"]]
        if named_parameters is not None:
            named = list(named_parameters)
            names = [n for n, _ in named]
            if len(set(names)) != len(names):
                raise ValueError("unisum.torch: named_parameters holds duplicate names")
            by_id = {id(p): n for n, p in named}
            missing = [p for p in all_params if id(p) not in by_id]
            if missing:
                raise ValueError("unisum.torch: %d optimizer parameters are missing from "
                                 "named_parameters" % len(missing))
            order = {id(p): i for i, (_, p) in enumerate(named)}
        else:
            # Unnamed: number the optimizers too (they are made in the same
            # order on every worker) so two of them never share names.
            global _optimizer_counter
            with _lock:
                _optimizer_counter += 1
                prefix = "optimizer%d.param." % _optimizer_counter
            by_id = {id(p): prefix + str(i) for i, p in enumerate(all_params)}
            order = {id(p): i for i, p in enumerate(all_params)}
        self._names: Dict[int, str] = by_id
        # Horovod's name for the same map, parameter -> name.
        self._parameter_names: Dict[torch.Tensor, str] = {p: by_id[id(p)] for p in all_params}
        # The first parameters (first layers) are needed first in the next
        # forward pass: higher priority.
        self._priority: Dict[int, int] = {pid: len(order) - i for pid, i in order.items()}
        # parameter -> (handle or None before the last pass, compress()'s
        # context, the tensor being summed)
        self._handles: Dict[torch.Tensor, Tuple[Optional[int], Any, Optional[torch.Tensor]]] = {}
        self._synchronized = False      # synchronize() ran since the last step()
        self._should_synchronize = True  # False inside skip_synchronize()
        self._delay: Dict[torch.Tensor, int] = {}
        self._grad_accs: List[Any] = []
        # Async (sync="async"): each parameter as this worker last had it
        # from the servers; a step sends the change since.
        self._mode = str(reduce.get("sync", "sync"))
        # dssync:G: each step averages the parameters within a group.
        self._dssync = self._mode.startswith("dssync:")
        # async or ssp:S: the servers hold the values.
        self._async = self._mode != "sync" and not self._dssync
        self._async_old: Dict[torch.Tensor, torch.Tensor] = {}
        # Async and dssync: the exchanges in flight, (parameter, pushed,
        # result, handle, the parameter's version when it started); an
        # overlapped dssync step leaves its group average here for the
        # next step() (UNISUM_DSSYNC_OVERLAP: unisum_init checked it).
        self._dssync_overlap = int(os.environ.get("UNISUM_DSSYNC_OVERLAP", "1") or "1") != 0
        self._inflight: List[Tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int]] = []
        if self._async:
            self._async_start()
            return
        if self._dssync:
            _optimizers.add(self)   # rejoin() forgets its exchange in flight
            return
        self._register_hooks()
        # Parameters whose home in the shared arena waits for its first
        # gradient's check (_share_gradients), and the check's hook.
        self._home_checks: Dict[torch.Tensor, Any] = {}
        if shared_gradients and local_size() > 1:
            self._share_gradients()
        _optimizers.add(self)

    def _unisum_reset(self) -> None:
        """The job re-formed (rejoin): what was in flight is gone, and an
        average is over the new number of workers."""
        self._handles.clear()
        self._inflight = []     # unisum_rejoin() ended them; their buffers may go
        _flying.discard(self)
        self._synchronized = False
        for p in self._delay:
            self._delay[p] = self._passes
        if self._pset == 0:
            self._members = size()

    def _exchange(self, items: List[Tuple[torch.Tensor, torch.Tensor]], flags: int) -> None:
        """push_pull of each (parameter, what to push) on the parameter's
        tensor of this optimizer's sync mode, all at once; loads each
        result into the parameter (and, async, its last-known copy)."""
        self._exchange_start(items, flags, copy=False)
        self._exchange_end()

    def _exchange_start(self, items: List[Tuple[torch.Tensor, torch.Tensor]], flags: int,
                        copy: bool) -> None:
        """Starts _exchange's push_pulls, each recorded in self._inflight
        as soon as it started, for _exchange_end.  `copy` pushes a copy,
        for a push that stays in flight while the caller goes on with the
        parameters.  What an interrupted wait left in flight ends first."""
        self._exchange_end()
        _flying.add(self)   # _exchange_end drops it once nothing is in flight
        for p, push in items:
            if p.is_cuda:
                raise TypeError("unisum.torch: DistributedOptimizer(sync=%r) keeps parameters on "
                                "the servers and takes CPU parameters only, for now; "
                                "lock-step (sync='sync') takes CUDA ones" % self._mode)
            name = self._mode.split(":")[0] + "." + self._names[id(p)]
            tid = _declared(name, p.dtype, p.numel(), self._priority.get(id(p), 0),
                            sync=self._mode)
            src = push.detach().clone(memory_format=torch.contiguous_format) if copy \
                else push.detach().contiguous()
            out = torch.empty_like(src)
            h = ctypes.c_int64(0)
            with _starting(h):
                _capi.check(_capi.lib.unisum_push_pull_async(tid, src.data_ptr(), out.data_ptr(),
                                                             flags, ctypes.byref(h)),
                            "unisum.torch: push_pull of '%s'" % name)
            self._inflight.append((p, src, out, h.value, p._version))
            _raise_kept()

    def _exchange_end(self) -> None:
        """Waits for each exchange in flight, in the order they started,
        and loads its result into its parameter (and, async, its
        last-known copy), unless the parameter was written since the
        push started (load_state_dict, a broadcast): the caller's values
        win.  An interrupted wait (Ctrl-C) leaves the rest in flight, and
        held, for the next call."""
        errors = []
        try:
            while self._inflight:
                p, _src, out, handle, version = self._inflight[0]
                rc = _wait(handle)
                self._inflight.pop(0)
                if rc != 0:
                    errors.append(rc)
                elif p._version == version:
                    with torch.no_grad():
                        p.data.copy_(out.view_as(p))
                    if self._async:
                        self._async_old[p] = out.view_as(p).clone()
        finally:
            if not self._inflight:
                _flying.discard(self)
        if errors:
            _capi.check(errors[0], "unisum.torch: push_pull (sync=%s)" % self._mode)

    def _dssync_step(self, closure: Optional[Callable[[], float]]) -> Optional[float]:
        """The wrapped optimizer's step on this worker's own gradients, then
        each parameter becomes the average over this step's group (as in
        DS-Sync, parameters rather than gradients: the groups drift apart
        between global steps, and averaging what they hold is what pulls
        them together), or over every worker on a global step.

        Overlapped (UNISUM_DSSYNC_OVERLAP=1, the default): the average of
        what the parameters held when the last step() ended was summed
        while this step's forward and backward ran on those same values;
        it is loaded now and this step's update applied on top, and the
        new values' average starts and is left in flight (D-PSGD's
        x' = W x - lr g(x), where the sketch's form is W (x - lr g(x))).
        The communication then hides behind the next step's compute, as
        lock-step's gradient sums hide behind backward.  With a closure
        the average is loaded before the closure runs: its gradient is
        taken at the average, and nothing overlaps."""
        self._exchange_end()
        loss = super(self._unisum_class, self).step(closure)
        self._exchange_start([(p, p.data) for group in self.param_groups for p in group["params"]],
                             _capi.AVERAGE, copy=self._dssync_overlap)
        if not self._dssync_overlap:
            self._exchange_end()
        return loss

    def global_average(self) -> None:
        """Averages every parameter over all workers now (DS-Sync's global
        step, e.g. at the end of training): every replica is then the
        same, bit for bit.  Lock-step and async optimizers have nothing to
        do."""
        if not self._dssync:
            return
        self._exchange_end()
        handles = [(p, push_pull_async(p.data, average=True,
                                       name="dssync.global." + self._names[id(p)]))
                   for group in self.param_groups for p in group["params"]]
        for p, h in handles:
            out = synchronize(h)
            with torch.no_grad():
                p.data.copy_(out.view_as(p))

    def _async_start(self) -> None:
        """Every parameter's first push: rank 0's values become the servers'
        (the others' are dropped), and every worker loads them."""
        self._exchange([(p, p.data) for group in self.param_groups for p in group["params"]], 0)

    def _async_step(self, closure: Optional[Callable[[], float]]) -> Optional[float]:
        """The wrapped optimizer's step on this worker's own gradients, then
        the change it made goes to the servers as a delta (added at once,
        no worker waiting for another), and the parameters become the
        servers' values as they stand."""
        loss = super(self._unisum_class, self).step(closure)
        self._exchange([(p, p.data - self._async_old[p]) for group in self.param_groups
                        for p in group["params"]], 0)
        return loss

    def _share_gradients(self) -> None:
        """Gives every gradient that does not exist yet a zeroed home in the
        shared arena; backward then accumulates into it in place.

        Only a dense gradient of the parameter's shape may live there, and
        which kind a parameter gets shows only in backward (the weight of
        nn.Embedding(sparse=True) gets a sparse one).  So a hook on each
        homed parameter looks at its first gradient as it arrives, before
        autograd adds it to ``.grad``: a gradient of another kind makes the
        parameter give its home up, and autograd then keeps that gradient
        as it came, as it would have without the arena."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad and p.grad is None and p.device.type == "cpu" and \
                        p.dtype in _DTYPES and p.numel() > 0:
                    p.grad = zeros_like(p)
                    self._home_checks[p] = p.register_hook(self._home_check(p))

    def _home_check(self, p: torch.Tensor) -> Callable[[torch.Tensor], None]:
        """The hook of _share_gradients on p, which runs once: on p's first
        gradient, as it arrives."""
        home = cast(torch.Tensor, p.grad).data_ptr()

        def check(grad: torch.Tensor) -> None:
            if grad.layout != torch.strided or grad.shape != p.shape or grad.dtype != p.dtype:
                if p.grad is not None and p.grad.data_ptr() == home:
                    p.grad = None       # still the untouched home: autograd stores grad as is
            self._home_checks.pop(p).remove()
        return check

    def _register_hooks(self) -> None:
        """Hooks every parameter that requires a gradient: its gradient is
        pushed when backward() has produced it for the last time before the
        next step().  PyTorch 2.1 and later say so themselves
        (register_post_accumulate_grad_hook); before, the hook goes on the
        parameter's gradient accumulator, which runs at the same moment."""
        for group in self.param_groups:
            for p in group["params"]:
                if not p.requires_grad:
                    continue
                self._delay[p] = self._passes
                if hasattr(p, "register_post_accumulate_grad_hook"):
                    self._grad_accs.append(p.register_post_accumulate_grad_hook(
                        self._make_hook(p)))
                    continue
                p_tmp = p.expand_as(p)
                grad_acc = p_tmp.grad_fn.next_functions[0][0]
                grad_acc.register_hook(self._make_hook(p))
                self._grad_accs.append(grad_acc)

    def _grad_name(self, p: torch.Tensor, tensor: torch.Tensor) -> str:
        """"gradient." and the parameter's name: a worker whose parameter
        differs in shape or dtype then fails at the declaration, with every
        other worker, instead of waiting for a name nobody else uses.  Only
        when this process already sums another gradient of that name with
        another shape (a second model with a parameter of the same name)
        does the shape join the name, the same way on every worker."""
        name = "gradient." + self._names[id(p)]
        with _lock:
            known = _tensors.get(_in_set(self._pset, name))
        if known is not None and (known[1], known[2]) != (tensor.dtype, tensor.numel()):
            name = _shaped(name, tensor)
        return name

    def _push_pull_grad(self, p: torch.Tensor) -> Tuple[Any, Any, Optional[torch.Tensor]]:
        """Starts summing p's gradient in place (compressed); returns the
        handle, compress()'s context and the tensor being summed.  A
        sparse gradient goes as Horovod's does: with sparse_as_dense, made
        dense and summed (synchronize() makes the sum sparse again);
        without, every worker's indices and values are allgathered, and
        the handle is a function that waits for them and gives the sparse
        sum (no compression, no predivision: Horovod's sparse path has
        neither)."""
        grad = cast(torch.Tensor, p.grad)
        if grad.is_sparse:
            self._sparse.add(p)
            if not self._sparse_as_dense:
                from unisum import _horovod
                return _horovod.sparse_allreduce_async(
                    grad, "gradient." + self._names[id(p)],
                    _horovod.Sum if self._sum else _horovod.Average,
                    self._process_set), None, None
            grad = grad.to_dense()
        compressed, ctx = self._compression.compress(grad)
        flags, scale = (0 if self._sum else _capi.AVERAGE), 1.0
        if self._predivide != 1.0:
            # Horovod's gradient_predivide_factor f: divided by f before the
            # sum, by size / f after it.
            compressed.copy_(_scaled(compressed, 1.0 / self._predivide))
            flags, scale = 0, self._predivide / self._members
        spec = self._spec if compressed.dtype == torch.float32 else None
        handle = _start(compressed, False, self._grad_name(p, compressed),
                        self._priority[id(p)], True, scale=scale, flags=flags, pset=self._pset,
                        compression=spec)
        return handle, ctx, compressed

    def _make_hook(self, p: torch.Tensor) -> Callable[..., None]:
        """The hook of p's gradient accumulator (see _register_hooks)."""
        def hook(*ignore: Any) -> None:
            if not self._included:
                return      # not in the optimizer's process set: nothing is summed
            if self._delay[p] <= 0:
                raise UnisumError(
                    "unisum.torch: gradients of '%s' were computed more than "
                    "backward_passes_per_step=%d times before step(); call step() or "
                    "synchronize() in between" % (self._names[id(p)], self._passes))
            self._delay[p] -= 1
            if self._delay[p] == 0:
                self._handles[p] = self._push_pull_grad(p)
            else:
                self._handles[p] = (None, None, None)
        return hook

    def synchronize(self) -> None:
        """Waits for every gradient's sum.  A parameter whose hook did not
        fire on this worker (unused in this step's graph here, perhaps used
        on others) contributes zeros, as in Horovod, so no worker waits
        forever for it.

        Each parameter's ``.grad`` then holds the average over the workers.
        Call it before reading or changing the gradients (to clip them, say),
        and then step() inside skip_synchronize().

        Raises:
            UnisumError: When a gradient's sum fails, or a gradient's name,
                dtype or size differs between the workers.
        """
        if self._dssync:
            self._exchange_end()    # the group average in flight, if any, loaded
            return
        if self._async:
            return      # nothing is summed: step() sends its changes
        self._start_missing()
        for p, (handle, ctx, _) in self._handles.items():
            self._land(p, handle, ctx)
        self._handles.clear()
        self._synchronized = True

    def _start_missing(self) -> None:
        """Starts the sum of every gradient whose hook has not started it:
        a parameter unused in this step's graph here (perhaps used on
        others) contributes zeros, as in Horovod, so no worker waits
        forever for it."""
        for group in self.param_groups:
            for p in group["params"]:
                if self._included and p.requires_grad and \
                        (p not in self._handles or self._handles[p][0] is None):
                    if p.grad is None:
                        # Unused here: zeros of the kind the others send
                        # (a sparse one known from an earlier step).
                        p.grad = torch.zeros_like(p)
                        if p in self._sparse:
                            p.grad = p.grad.to_sparse(p.dim())
                    self._handles[p] = self._push_pull_grad(p)

    def _land(self, p: torch.Tensor, handle: Any, ctx: Any) -> None:
        """Waits for the sum of p's gradient that `handle` stands for
        (_push_pull_grad's, with compress()'s context `ctx`) and puts it in
        p.grad."""
        grad = cast(torch.Tensor, p.grad)
        if callable(handle):
            p.grad = handle()       # a sparse gradient's allgathered sum
        elif grad.is_sparse:
            out = self._compression.decompress(synchronize(handle), ctx)
            p.grad = out.reshape(grad.shape).to_sparse(grad.sparse_dim())
        else:
            out = self._compression.decompress(synchronize(handle), ctx)
            if out.data_ptr() != grad.data_ptr():
                grad.copy_(out.view_as(grad))
        self._delay[p] = self._passes

    def _update_only(self, p: torch.Tensor) -> None:
        """The wrapped optimizer's step for parameter p alone, on its
        gradient as it stands (CrossBarrier's update as each sum lands):
        the step sees one parameter group, p's own with p alone in it, so
        an optimizer whose update of a parameter depends on that
        parameter only (SGD, Adam, RMSprop, Adagrad, ...) updates it as a
        whole step would."""
        groups = self.param_groups
        group = next(g for g in groups if any(q is p for q in g["params"]))
        params = group["params"]
        group["params"] = [p]
        self.param_groups = [group]
        try:
            super(self._unisum_class, self).step()
        finally:
            group["params"] = params
            self.param_groups = groups

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """A context in which step() does not synchronize, because the
        caller did (Horovod's name and behaviour)::

            optimizer.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            with optimizer.skip_synchronize():
                optimizer.step()

        It raises nothing itself.
        """
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        """Waits for the sums of the gradients (synchronize()), unless inside
        skip_synchronize(), then updates the parameters as the wrapped
        optimizer does and returns what its step() returns.

        Warns (UserWarning) when synchronize() already ran since the last
        step() outside skip_synchronize(): the gradients are then summed
        again, which costs a whole round of communication.

        Args:
            closure: As for the wrapped optimizer's step(): a function that
                re-evaluates the model and returns the loss, or None.

        Raises:
            UnisumError: When a gradient's sum fails (see synchronize()).
        """
        if self._async:
            return self._async_step(closure)
        if self._dssync:
            return self._dssync_step(closure)
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn(
                    "unisum.torch: optimizer.step() called without "
                    "optimizer.skip_synchronize() context after optimizer.synchronize(): every "
                    "gradient is summed over the workers again, which costs a whole round of "
                    "communication. Use "
                    "`with optimizer.skip_synchronize(): optimizer.step()` after synchronize().")
            self.synchronize()
        self._synchronized = False
        return super(self._unisum_class, self).step(closure)

    def zero_grad(self, set_to_none: Optional[bool] = None) -> None:
        """Zeroes the gradients as the wrapped optimizer does.

        Args:
            set_to_none: Set each ``.grad`` to None instead of zeroing it;
                None: the wrapped optimizer's own default (False in
                PyTorch 1.x, True from 2.0).

        Raises:
            UnisumError: When gradients are being summed (after backward(),
                before step() or synchronize()): zeroing them then would
                discard them.
        """
        if self._handles:
            raise UnisumError("unisum.torch: zero_grad() between backward() and step() would "
                              "discard gradients being summed; call step() or synchronize() first")
        if set_to_none is None:
            return super(self._unisum_class, self).zero_grad()
        return super(self._unisum_class, self).zero_grad(set_to_none=set_to_none)


_OptimizerT = TypeVar("_OptimizerT", bound=torch.optim.Optimizer)


# BytePS's compression_params keys that the C spec takes (compress.h).
_COMPRESSION_KEYS = ("compressor", "ef", "momentum", "momentum_mu", "mu", "scaling", "k",
                     "seed", "s", "normalize", "partition")


def _compression_spec(params: Optional[Dict[str, Any]]) -> Optional[str]:
    """The C spec text of BytePS's compression_params (None: none)."""
    if not params:
        return None
    if "compressor" not in params:
        raise ValueError("unisum.torch: compression_params needs a 'compressor' (one of "
                         "onebit, topk, randomk, dithering, fp16, bf16)")
    words = []
    for key, value in params.items():
        if key not in _COMPRESSION_KEYS:
            raise ValueError("unisum.torch: compression_params has an unknown key %r (known: "
                             "%s)" % (key, ", ".join(_COMPRESSION_KEYS)))
        if isinstance(value, bool):
            value = int(value)
        words.append("%s=%s" % (key, value))
    words.sort(key=lambda w: not w.startswith("compressor="))
    return ",".join(words)


def DistributedOptimizer(optimizer: _OptimizerT,
                         named_parameters: Optional[Iterable[Tuple[str, torch.Tensor]]] = None,
                         compression: Compressor = Compression.none,
                         backward_passes_per_step: int = 1,
                         op: int = 0, gradient_predivide_factor: float = 1.0,
                         num_groups: int = 0, groups: Any = None,
                         sparse_as_dense: bool = False, process_set: Any = None,
                         shared_gradients: bool = True, sync: Optional[str] = None,
                         compression_params: Optional[Dict[str, Any]] = None) -> _OptimizerT:
    """Wraps `optimizer` so that every gradient is summed over all workers
    (averaged) as soon as backward() produces it, and step() waits for the
    sums before updating.  With shared_gradients (and several workers on
    this machine) the gradients live in the shared arena (see empty()).

    Returns a new optimizer, of a subclass of `optimizer`'s class, over the
    same parameter groups and with the same state; use it instead of
    `optimizer`.  Besides the wrapped class's methods it has synchronize()
    and skip_synchronize() (see the module docstring), and its zero_grad()
    refuses to discard gradients being summed.

    Args:
        optimizer: The torch.optim.Optimizer to wrap.
        named_parameters: The model's named_parameters(): each gradient is
            summed under its parameter's name, so the workers may differ in
            the order of their optimizer's parameters.  None names them by
            their place in the optimizer (and the optimizer by its place
            among the DistributedOptimizers made so far), which must then be
            the same on every worker.
        compression: How gradients travel: Compression.none, or
            Compression.fp16 to send float gradients as float16.
        backward_passes_per_step: How many backward passes each step()
            follows; their gradients are summed locally before the last one
            is pushed.
        op: Horovod's: Average (0, the default) or Sum (1) of the
            gradients; Adasum raises NotImplementedError.
        gradient_predivide_factor: Horovod's f (op Average only): each
            gradient is divided by f before the sum and the sum by size/f
            after it (the same average, another rounding).
        num_groups, groups: Horovod's fusion groups, which change how it
            batches, not what it computes; taken and checked, and unused:
            unisum's PUSH stage already batches by priority under a credit.
        sparse_as_dense: A sparse gradient (nn.Embedding(sparse=True)'s)
            is made dense and summed, and the sum made sparse again; by
            default, as in Horovod, every worker's indices and values are
            allgathered instead (sparse_allreduce_async), which moves
            only the rows that changed.  Either way the gradient stays
            sparse, and out of the shared arena.
        process_set: A Horovod process set (add_process_set): gradients
            are averaged over its members only; on other ranks the
            optimizer sums nothing (as in Horovod).  None: every worker.
        shared_gradients: Put the gradients in the shared arena when several
            workers run on this machine; False keeps PyTorch's memory.
        sync: "sync" (lock-step: the gradients are averaged, as above) or
            "async" (BytePS's asynchronous training: each step() runs the
            wrapped optimizer on this worker's own gradients and sends the
            change it made, new - old, to the servers, which add it at
            once and hold the parameters; the parameters then become the
            servers' values as they stand, no worker waiting for another.
            The first values are rank 0's, taken at construction), or
            "ssp:S" (async with bounded staleness: a step() returns only
            once no worker is more than S steps behind this one; S=0 is
            lock-step), or "dssync:G" (divide and shuffle: each step()
            runs the wrapped optimizer on this worker's own gradients and
            then averages the parameters within a group of G workers,
            another every step, derived from the step and the job, and
            every UNISUM_DSSYNC_GLOBAL_EVERY-th step over all workers;
            global_average() averages over all now.  With
            UNISUM_DSSYNC_OVERLAP=1, the default, a step's average runs
            during the next step's forward and backward, which the next
            step() loads before its update: D-PSGD's form).  None: UNISUM_SYNC,
            or BYTEPS_ENABLE_ASYNC=1, else "sync".
        compression_params: BytePS's gradient compression, done by the
            C library: the machine's root compresses each partition of the
            machine's float32 gradient sum, the servers decompress, sum,
            compress the sum once, and every worker decompresses it.  A
            dict with BytePS's keys: "compressor" ("onebit", "topk",
            "randomk", "dithering", "fp16", "bf16"), "ef" ("vanilla", or
            "sparse" for randomk: error feedback), "momentum"
            ("nesterov", applied before compressing: give the wrapped
            optimizer no momentum of its own) and "momentum_mu", "scaling"
            (onebit), "k" (topk, randomk: a count, or a fraction below 1),
            "seed", "s", "normalize" and "partition" (dithering), e.g.
            {"compressor": "onebit", "ef": "vanilla", "momentum":
            "nesterov"}.  Gradients below UNISUM_MIN_COMPRESS_BYTES (64
            KiB) and of other dtypes go uncompressed.

    Raises:
        UnisumError: When init() has not been called.
        ValueError: When backward_passes_per_step is below 1, when
            named_parameters holds a name twice, or when it lacks some of
            the optimizer's parameters; for gradient_predivide_factor with
            op Sum, for an unknown op or sync mode, and for sync="async"
            with a process set or compression; for compression_params
            with compression, a process set or an unknown key.
        NotImplementedError: For op Adasum.
    """
    # The arguments first, as Horovod checks them: before init() too.
    if named_parameters is not None:
        named_parameters = list(named_parameters)
        names = [n for n, _ in named_parameters]
        if len(set(names)) != len(names):
            raise ValueError("unisum.torch: named_parameters holds duplicate names")
    if backward_passes_per_step < 1:
        raise ValueError("unisum.torch: backward_passes_per_step must be >= 1")
    if op == 2:
        raise NotImplementedError("unisum.torch: DistributedOptimizer(op=Adasum) is not "
                                  "implemented; use op=Average")
    if op not in (0, 1):
        raise ValueError("unisum.torch: DistributedOptimizer takes op=Average or op=Sum, got %r"
                         % (op,))
    if gradient_predivide_factor != 1.0 and op != 0:
        raise ValueError("unisum.torch: gradient_predivide_factor is for op=Average only")
    if groups is not None and not (isinstance(groups, int) and groups > 0 or
                                   isinstance(groups, list) and
                                   all(isinstance(g, list) for g in groups)):
        raise ValueError("unisum.torch: groups must be a positive int or a list of lists of "
                         "parameters, as in Horovod")
    if num_groups < 0:
        raise ValueError("unisum.torch: num_groups must be >= 0")
    mode = _sync_mode(sync)
    spec = _compression_spec(compression_params)
    if spec is not None and (compression is not Compression.none or process_set is not None):
        raise ValueError("unisum.torch: DistributedOptimizer takes compression_params without "
                         "compression= and without a process_set")
    if mode != "sync" and (process_set is not None or compression is not Compression.none or
                           spec is not None):
        raise ValueError("unisum.torch: DistributedOptimizer(sync=%r) takes neither a "
                         "process_set nor compression" % mode)
    _require_init()
    pset = _pset_of(process_set, member=False)
    ranks = getattr(process_set, "ranks", None) if pset != 0 else None
    reduce = {"sum": op == 1, "predivide": float(gradient_predivide_factor),
              "sparse_as_dense": sparse_as_dense, "pset": pset, "process_set": process_set,
              "members": len(ranks) if ranks else size(),
              "included": ranks is None or rank() in ranks, "sync": mode,
              "compression": spec}
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    # The wrapper's methods call the wrapped class's through this class,
    # not self.__class__, which a subclass of it would make recurse.
    cls._unisum_class = cls
    wrapped = cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
                  shared_gradients, reduce)
    wrapped.load_state_dict(optimizer.state_dict())
    return wrapped


# Horovod's names (allreduce, broadcast, the queries, ReduceOp values):
# thin wrappers over the collectives above, in their own module.
from unisum._horovod import *  # noqa: E402,F401,F403
from unisum._horovod import __all__ as _horovod_all  # noqa: E402

__all__ += _horovod_all

# Elastic training (Horovod's hvd.elastic): run, State, TorchState, ...
from unisum.torch import elastic  # noqa: E402
