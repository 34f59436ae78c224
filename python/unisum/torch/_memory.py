"""Memory for unisum.torch (private): tensors in the worker's shared arena
(empty, zeros_like) and the pool of result buffers that collectives
returning a new tensor reuse.
"""

from __future__ import annotations

import collections
import ctypes
import math
import queue
import threading
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union, cast

import torch

from unisum import _capi

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
