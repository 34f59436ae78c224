"""The operations of ``byteps.torch.ops``: declare, push_pull and its forms,
the handles' poll and synchronize (and the private starts the other
modules build on), and the group-sync counting of BytePS's
DistributedDataParallel.

    import unisum.torch.ops as ops
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Any, Callable, Optional, Tuple, cast

import torch

from unisum import _capi
from unisum._capi import UnisumError
from unisum.torch.compression import Compression, Compressor
from unisum.torch._core import (_DTYPES, _Op, _WAIT_SLICE_MS, _calls, _lock, _nap, _ops,
                                _raise_kept, _register, _require_init, _settle, _specs,
                                _stages_through, _starting, _step, _take, _tensors, rank)
from unisum.torch._memory import _result

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


# BytePS's group-sync counter: how many push_pull_group_sync_inplace calls
# since it last reached byteps_torch_set_num_grads' number (then it starts
# again at 0).  Its DistributedDataParallel synchronizes every gradient when
# the count it gets back equals the number of gradients.
_group_lock = threading.Lock()
_group_grads = 0
_group_count = 0


def byteps_torch_set_num_grads(num_grads: int) -> int:
    """Sets how many gradients make a group for push_pull_group_sync_inplace,
    and starts its count again.  Returns 0, as BytePS's does."""
    global _group_grads, _group_count
    with _group_lock:
        _group_grads = int(num_grads)
        _group_count = 0
    return 0


def push_pull_group_sync_inplace(tensor: torch.Tensor, average: bool = True,
                                 name: Optional[str] = None, version: int = 0,
                                 priority: int = 0) -> Tuple[int, int]:
    """push_pull_async_inplace, counted: returns its handle and this call's
    place in the group (1, 2, ... up to byteps_torch_set_num_grads' number,
    after which the count starts again), as BytePS's does.

    Raises:
        UnisumError, TypeError, ValueError: As push_pull_async_inplace.
    """
    global _group_count
    handle = push_pull_async_inplace(tensor, average, name, version, priority)
    with _group_lock:
        _group_count += 1
        count = _group_count
        if _group_count == _group_grads:
            _group_count = 0
    return handle, count
