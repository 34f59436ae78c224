"""What Horovod's gathering collectives share: names in flight, the checks
of a rank's own input, the exchange of every rank's shape (its records and
their agreement), and the launch of an allgather or alltoall on push_pull.
"""

from __future__ import annotations

import ctypes
from typing import Callable, List, Optional, Tuple

import torch

from unisum import _capi
from unisum.torch._core import _DTYPES, _lock, _ops, _starting
from unisum.torch.ops import _declared, _in_set, _undeclare
from unisum._capi import UnisumError
from unisum._horovod.basics import HorovodInternalError, _Group


# ---- allgather and reducescatter, on push_pull (see the module docstring) ----

_DTYPE_CODES = {dt: i for i, dt in enumerate(
    (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64,
     torch.uint8, torch.int8, torch.int16, torch.bool))}
_RECORD = 11       # int64s per rank: rows, ndim, dtype, then up to 8 trailing dimensions


class _NameInFlight(UnisumError, ValueError):
    """A collective was started under a name that has one in flight; a
    ValueError too, which is what Horovod raises."""


_names_in_flight: set = set()    # user names of gathering collectives in flight


def _claim_name(name: Optional[str], what: str) -> Callable[[], None]:
    """Marks `name` in flight (Horovod refuses a second collective of one
    name while the first runs); returns what lets it go."""
    if name is None:
        return lambda: None
    with _lock:
        if name in _names_in_flight:
            raise _NameInFlight("unisum.torch: %s: a collective named '%s' is already in "
                                "flight; wait for it first" % (what, name), _capi.EBUSY)
        _names_in_flight.add(name)

    def release() -> None:
        with _lock:
            _names_in_flight.discard(name)
    return release


def _held(name: Optional[str], what: str, start: Callable[[], int]) -> int:
    """Runs start() with `name` held in flight until its handle is
    synchronized: as in Horovod, a second collective of that name before
    then is a ValueError, even when the first has completed already."""
    release = _claim_name(name, what)
    try:
        handle = start()
    except BaseException:
        release()
        raise
    with _lock:
        op = _ops.get(handle)
    if op is None:
        release()
        return handle
    first = op.finish

    def finish() -> None:
        try:
            first()
        finally:
            release()
    op.finish = finish
    return handle


def _host_only(tensor: torch.Tensor, what: str) -> None:
    """The gathering collectives run on host tensors only, for now (issue
    22 brought CUDA tensors to push_pull, the broadcasts and
    DistributedOptimizer): a TypeError that says what to do."""
    if isinstance(tensor, torch.Tensor) and tensor.is_cuda:
        raise TypeError("unisum.torch: %s of a CUDA tensor is not supported yet; pass "
                        "tensor.cpu() and move the result back with .to(device)" % what)


def _busy_as_value_error(start: Callable[[], int]) -> int:
    """Runs start(); the C library's EBUSY (this name has an operation in
    flight) comes out as _NameInFlight, a ValueError as in Horovod."""
    try:
        return start()
    except UnisumError as e:
        if e.code == _capi.EBUSY:
            raise _NameInFlight(str(e), e.code) from None
        raise


def _record_check(tensor: torch.Tensor, what: str) -> None:
    """Raises unless `tensor` can go in an exchange's table (_records)."""
    if tensor.dim() == 0:
        raise ValueError("unisum.torch: %s needs a tensor of at least one dimension" % what)
    if tensor.dtype not in _DTYPE_CODES or tensor.dim() > _RECORD - 3:
        raise TypeError("unisum.torch: %s of %s tensors of %d dimensions is not supported"
                        % (what, tensor.dtype, tensor.dim()))


def _refusal(check: Callable[[], None]) -> Optional[Exception]:
    """The ValueError or TypeError with which check() refuses this rank's
    input, or None.  A gathering collective refused so still runs its
    exchange, saying so in its row: every rank's call then fails at once
    (_agreed) and the next calls stay paired, instead of this rank
    raising alone while the others wait for it."""
    try:
        check()
    except (ValueError, TypeError) as e:
        return e
    return None


def _records(tensor: torch.Tensor, grp: _Group, lead: List[int],
             refused: Optional[Exception] = None,
             refused_lead: Optional[List[int]] = None) -> torch.Tensor:
    """The table a gathering collective's exchange sums: a row per rank,
    this rank's holding `lead` (allgather: its rows; alltoall: its splits)
    then its tensor's dimensions, dtype and trailing dimensions, which
    _agreed checks alike on every rank, as Horovod's coordinator does.
    The caller has checked the tensor (_refusal of _record_check): a
    `refused` call's row says only that (-1 dimensions), after
    `refused_lead` (zeros if None)."""
    width = len(lead) + _RECORD - 1
    if refused is not None:
        row = (refused_lead if refused_lead is not None else [0] * len(lead)) + [-1]
    else:
        dims = list(tensor.shape)
        row = lead + [len(dims), _DTYPE_CODES[tensor.dtype]] + dims[1:]
    table = [[0] * width for _ in range(grp.n)]
    table[grp.k] = row + [0] * (width - len(row))
    return torch.tensor(table, dtype=torch.int64)


def _agreed(recs: List[List[int]], what: str, at: int, grp: _Group,
            refused: Optional[Exception] = None) -> List[List[int]]:
    """The exchanged table's rows `recs` (its tolist()), after checking (on
    every rank alike) that no rank refused its input (this rank raises its
    own `refused`, the others HorovodInternalError naming it), that no
    rank has joined, and that dtypes and trailing dimensions (from column
    `at`) agree.  Raises
    HorovodInternalError naming two ranks that differ."""
    if refused is not None:
        raise refused
    for q in range(len(recs)):
        if recs[q][at] < 0:
            raise HorovodInternalError(
                "unisum.torch: %s: rank %d's input was refused (it raised its own error: see its "
                "log), so this %s fails on every rank" % (what, grp.ranks[q], what))
    for q in range(len(recs)):
        if recs[q][at] == 0:     # no dimensions: its zeros came from join()
            raise HorovodInternalError(
                "unisum.torch: %s: rank %d has joined (join()), and until every rank has, a "
                "gathering collective cannot run: it needs every rank's data" % (what, grp.ranks[q]))
    for q in range(len(recs)):
        if recs[q][at:] != recs[0][at:]:
            a, b = recs[0][at:], recs[q][at:]
            raise HorovodInternalError(
                "unisum.torch: %s: rank %d has a %d-dimensional tensor of dtype code %d and "
                "trailing dimensions %s, rank %d one of %d dimensions, dtype code %d, trailing "
                "%s: every rank must pass the same dtype and dimensions but the first" %
                (what, grp.ranks[0], a[0], a[1], a[2:1 + a[0]], grp.ranks[q], b[0], b[1],
                 b[2:1 + b[0]]))
    return recs


def _widened(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor`, or for the dtypes the C library has no name for (bool,
    uint8, int8, int16) the same values as int32: exact both ways."""
    return tensor if tensor.dtype in _DTYPES else tensor.to(torch.int32)


def _set_launch(kind: str, name: str, send: torch.Tensor, recv: torch.Tensor,
                counts: List[int], after: Callable[[], None], flags: int,
                grp: _Group) -> Tuple[Optional[int], Callable[[], None]]:
    """_gather_launch in a process set: the C library's gathering
    collectives run on the global set only, so here the members push_pull
    one buffer of the whole result, each zero outside its own part (a sum
    of zeros and one value is that value, exactly, whatever the dtype), and
    each copies its part out.  Costs a push_pull of the whole result."""
    n, k = grp.n, grp.k
    flat = send.reshape(-1)
    if kind == "allgather":
        start = sum(counts[:k])
        buf = torch.zeros(sum(counts), dtype=send.dtype)
        buf[start:start + counts[k]] = flat
        lo, hi = 0, buf.numel()
    elif kind == "reducescatter":
        buf = flat.clone()
        lo = sum(counts[:k])
        hi = lo + counts[k]
    else:
        # counts[q * n + j]: source q's elements for j; laid out by
        # destination, then source, as the C library's alltoall.
        at, pos = 0, {}
        for j in range(n):
            for q in range(n):
                pos[(q, j)] = at
                at += counts[q * n + j]
        buf = torch.zeros(at, dtype=send.dtype)
        src = 0
        for j in range(n):
            c = counts[k * n + j]
            buf[pos[(k, j)]:pos[(k, j)] + c] = flat[src:src + c]
            src += c
        lo = pos[(0, k)] if n else 0
        hi = lo + sum(counts[q * n + k] for q in range(n))
    wire = _in_set(grp.pset, name)

    def finish(_alive: torch.Tensor = buf) -> None:
        recv.reshape(-1).copy_(buf[lo:hi])
        after()
        _undeclare(wire)

    if buf.numel() == 0:
        finish()
        return None, lambda: None
    tid = _declared(wire, buf.dtype, buf.numel(), 0)
    h = ctypes.c_int64(0)
    try:
        with _starting(h):   # the caller runs _raise_kept once it is on record
            _capi.check(_capi.lib.unisum_push_pull_async(tid, buf.data_ptr(), buf.data_ptr(),
                                                         flags, ctypes.byref(h)),
                        "unisum.torch: " + kind)
    except BaseException:
        _undeclare(wire)
        raise
    return h.value, finish


def _gather_launch(kind: str, name: str, send: torch.Tensor, recv: torch.Tensor,
                   counts: List[int], after: Callable[[], None],
                   flags: int = 0, grp: Optional[_Group] = None,
                   shape: Optional[Tuple[int, ...]] = None, keep: bool = False
                   ) -> Tuple[Optional[int], Callable[[], None]]:
    """Starts the C library's allgather, reduce-scatter or alltoall (`kind`)
    of `send` into `recv` with the layout `counts` on the one-shot tensor
    `name` of sum(counts) elements (alltoall: of the n x n counts).
    Returns its C handle and what finishes it (runs `after`, forgets the
    tensor); with nothing to move, None and a finish already run.  In a
    process set (`grp`), see _set_launch.  `shape`: the dimensions every
    rank passes alike (reduce-scatter's input), declared with the tensor
    so that ranks whose dimensions differ fail even when the counts
    agree.  `keep`: `name` is a slot's tensor, left declared."""
    if grp is not None and grp.pset != 0:
        return _set_launch(kind, name, send, recv, counts, after, flags, grp)
    total = sum(counts)
    tid = _declared(name, send.dtype, total, 0, shape)
    # An empty side still needs an address; nothing is read or written there.
    spare = torch.empty(1, dtype=send.dtype)

    def finish(_alive: torch.Tensor = spare) -> None:
        after()
        if not keep:
            _undeclare(name)

    if total == 0:
        finish()
        return None, lambda: None
    in_ptr = send.data_ptr() if send.numel() else spare.data_ptr()
    out_ptr = recv.data_ptr() if recv.numel() else spare.data_ptr()
    arr = (ctypes.c_uint64 * len(counts))(*counts)
    h = ctypes.c_int64(0)
    try:
        with _starting(h):   # the caller runs _raise_kept once it is on record
            if kind == "reducescatter":
                rc = _capi.lib.unisum_reduce_scatter_async(tid, in_ptr, out_ptr, arr, flags,
                                                           ctypes.byref(h))
            elif kind == "allgather":
                rc = _capi.lib.unisum_allgather_async(tid, in_ptr, out_ptr, arr, ctypes.byref(h))
            else:
                rc = _capi.lib.unisum_alltoall_async(tid, in_ptr, out_ptr, arr, ctypes.byref(h))
            _capi.check(rc, "unisum.torch: " + kind)
    except BaseException:
        if not keep:
            _undeclare(name)
        raise
    return h.value, finish
