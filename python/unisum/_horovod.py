"""Horovod's names in unisum.torch: the collectives and the queries.

``import unisum.torch as hvd`` gives a Horovod program these names on top
of unisum's own (``init``, ``rank``, ``size``, ``synchronize``, ``poll``,
``DistributedOptimizer``, ...).  They run on the same servers, pipeline
and failure handling as push_pull.

What works as in Horovod, and what does not yet (issue 17):

* ``allreduce`` (and ``allreduce_``, ``allreduce_async``,
  ``allreduce_async_``, ``grouped_allreduce``, ``grouped_allreduce_``)
  with ``op=Average``, ``Sum``, ``Min``, ``Max`` or ``Product`` (or the
  older ``average=``), ``prescale_factor`` and ``postscale_factor``; the
  servers reduce with the op.  ``allreduce`` is differentiable: its
  gradient is the allreduce of the gradient with the same op and factors,
  as in Horovod.  ``Adasum`` raises NotImplementedError (use ``Average``).
* ``broadcast`` (differentiable: the gradient is averaged over the workers
  and kept on the root, zero elsewhere, as in Horovod), ``broadcast_``,
  ``broadcast_async`` and ``broadcast_async_``, for every dtype.
* ``allgather`` (first dimensions may differ by rank; every dtype;
  differentiable), ``allgather_async``, ``grouped_allgather`` and
  ``allgather_object``; ``reducescatter`` (Average or Sum, the factors;
  rows split as ``torch.tensor_split`` does: the first ranks get one more
  when they do not divide evenly; differentiable), ``reducescatter_async``
  and ``grouped_reducescatter``; ``alltoall`` with ``splits`` (returning
  the received splits too, as Horovod) and ``alltoall_async``, whose
  synchronize() returns both.  They call the C library's allgather,
  reduce-scatter and alltoall, which move only what each machine must
  (docs/ARCHITECTURE.md section 2), after one small push_pull: allgather's
  of every rank's shape (checked alike on every rank, as Horovod's
  coordinator does; when the layout repeats, the rows start before it,
  see _speculate), alltoall's of every rank's splits (and dimensions
  and dtype, checked alike).
* ``is_initialized``, ``cross_rank``, ``cross_size`` (the machines),
  ``is_homogeneous`` (always true: every machine runs UNISUM_LOCAL_SIZE
  workers), and ``HorovodInternalError`` (unisum's error type).
* ``mpi_built``, ``gloo_built``, ``nccl_built``, ``ccl_built``,
  ``ddl_built``, ``cuda_built``, ``rocm_built`` and the ``*_enabled``
  queries answer False: unisum runs neither MPI nor gloo nor NCCL; its
  collectives run on its own Summation Service (``unisum_built`` is True).
* Process sets: ``ProcessSet``, ``add_process_set``, ``remove_process_set``,
  ``global_process_set``, ``init(process_sets=...)`` and ``process_set=`` on
  every collective, ``barrier``, ``broadcast_object`` and
  ``DistributedOptimizer``.  A set's collectives run among its members
  alone, on tensors and rounds of their own on the same servers (C:
  ``unisum_declare_in``); each member pushes for itself (the machine's
  local reduce serves the global set).  Differences from Horovod:
  ``add_process_set`` is local (only members need call it), and in a set
  the gathering collectives push_pull one zero-padded buffer of the whole
  result instead of moving only each machine's share.
"""

from __future__ import annotations

import ctypes
import math
import pickle
from typing import Any, Callable, List, Optional, Sequence, Tuple, cast

import torch

from unisum import _capi
from unisum import torch as _t
from unisum._capi import UnisumError

__all__ = [
    "Average", "Sum", "Adasum", "Min", "Max", "Product", "HorovodInternalError",
    "is_initialized", "cross_rank", "cross_size", "is_homogeneous",
    "mpi_built", "mpi_enabled", "gloo_built", "gloo_enabled", "nccl_built", "ccl_built",
    "ddl_built", "cuda_built", "rocm_built", "unisum_built",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "grouped_allreduce", "grouped_allreduce_",
    "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
    "allgather", "allgather_async", "grouped_allgather", "allgather_object",
    "reducescatter", "reducescatter_async", "grouped_reducescatter",
    "alltoall", "alltoall_async", "sparse_allreduce_async", "SyncBatchNorm", "join",
]

# Horovod's ReduceOp values (horovod.torch.mpi_ops).
Average = 0
Sum = 1
Adasum = 2
Min = 3
Max = 4
Product = 5
_OP_NAMES = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max",
             Product: "Product"}

HorovodInternalError = UnisumError


class ProcessSet:
    """A group of ranks that runs collectives of its own (Horovod's): pass
    it to add_process_set(), then as `process_set=` to any collective.
    Its collectives run among its members alone, on tensors and rounds of
    their own, summed on the job's servers (unisum_declare_in)."""

    process_set_id: Optional[int] = None
    ranks: Optional[List[int]] = None

    def __init__(self, ranks_or_comm: Sequence[int]) -> None:
        ranks = sorted(ranks_or_comm)
        if any(not isinstance(r, int) for r in ranks):
            raise ValueError("unisum.torch: ProcessSet takes a list of ranks (unisum has no "
                             "MPI communicators)")
        self.ranks = ranks

    def _invalidate(self) -> None:
        self.process_set_id = None

    def size(self) -> Optional[int]:
        """How many ranks it has, or None before add_process_set()."""
        if self.process_set_id is None:
            return None
        return _t.size() if self.process_set_id == 0 else len(self.ranks or [])

    def rank(self) -> Optional[int]:
        """This worker's place among the set's ranks (None before
        add_process_set(), or outside the set).  Collectives still take
        global ranks (broadcast's root_rank), as in Horovod."""
        if self.process_set_id is None:
            return None
        if self.process_set_id == 0:
            return _t.rank()
        me = _t.rank()
        return (self.ranks or []).index(me) if me in (self.ranks or []) else None

    def included(self) -> Optional[bool]:
        """Whether this worker is in the set."""
        if self.process_set_id == 0:
            return True
        return None if self.ranks is None else _t.rank() in self.ranks

    def __str__(self) -> str:
        return "ProcessSet(process_set_id=%s, ranks=%s)" % (self.process_set_id, self.ranks)

    __repr__ = __str__


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


def add_process_set(process_set: Any) -> ProcessSet:
    """Adds a process set (a ProcessSet or a list of ranks) and returns it
    with its id.  Unlike Horovod, only its members need to call it (it is
    local to each worker); ids count from 1 in the order a worker adds
    sets, and a set is known on the wire by its ranks, not its id.

    Raises:
        ValueError: For ranks outside the job, a rank twice, or ranks that
            are a set already (every rank is the global set).
    """
    _t._require_init()
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    ranks = process_set.ranks or []
    if ranks == list(range(_t.size())):
        raise ValueError("unisum.torch: attempted to add a duplicate process set: %s holds every "
                         "rank, which is the global process set" % (process_set,))
    arr = (ctypes.c_int * len(ranks))(*ranks)
    rc = _capi.lib.unisum_process_set_add(arr, len(ranks))
    if rc == _capi.EINVAL:
        raise ValueError("unisum.torch: cannot add process set %s: %s" % (
            process_set, _capi.lib.unisum_last_error().decode("utf-8", "replace")))
    process_set.process_set_id = _capi.check(rc, "unisum.torch: add_process_set")
    return process_set


def remove_process_set(process_set: ProcessSet) -> bool:
    """Removes a process set added with add_process_set() (its tensors are
    undeclared) and returns True; False for the global set or a set not
    added."""
    pid = getattr(process_set, "process_set_id", None)
    if pid is None or pid == 0:
        return False
    process_set._invalidate()
    with _t._lock:
        for name in [n for n in _t._tensors if n.startswith("%s%d%s" % (_t._SET_TAG, pid,
                                                                          _t._SET_TAG))]:
            del _t._tensors[name]
        _t._calls.pop(pid, None)
    return _capi.lib.unisum_process_set_remove(int(pid)) == 0


class _Group:
    """Where a collective runs: process set `pset` (0: every worker), its
    member ranks in order, this worker's index among them."""

    def __init__(self, process_set: Any) -> None:
        self.pset = _t._pset_of(process_set)
        self.ranks = list(range(_t.size())) if self.pset == 0 else list(process_set.ranks)
        me = _t.rank()
        if me not in self.ranks:
            raise ValueError("unisum.torch: rank %d is not in %s" % (me, process_set))
        self.n, self.k = len(self.ranks), self.ranks.index(me)


def is_initialized() -> bool:
    """True between init() and shutdown()."""
    return _t._initialized


def cross_rank() -> int:
    """This worker's machine among the job's machines (Horovod's cross rank)."""
    return _t.rank() // _t.local_size()


def cross_size() -> int:
    """How many machines the job has (Horovod's cross size)."""
    return _t.size() // _t.local_size()


def is_homogeneous() -> bool:
    """True: every machine of a unisum job runs the same number of workers."""
    _t._require_init()
    return True


def unisum_built() -> bool:
    """True: the collectives run on unisum's Summation Service."""
    return True


def _answers_false(name: str, doc: str) -> Callable[[], bool]:
    """A query of Horovod's that unisum answers False to."""
    def query() -> bool:
        return False
    query.__name__ = query.__qualname__ = name
    query.__doc__ = doc
    return query


mpi_built = _answers_false("mpi_built", "False: unisum does not use MPI.")
mpi_enabled = _answers_false("mpi_enabled", "False: unisum does not use MPI.")
gloo_built = _answers_false("gloo_built", "False: unisum does not use gloo; see unisum_built().")
gloo_enabled = _answers_false("gloo_enabled", "False: unisum does not use gloo.")
nccl_built = _answers_false("nccl_built", "False: unisum does not use NCCL.")
ccl_built = _answers_false("ccl_built", "False: unisum does not use oneCCL.")
ddl_built = _answers_false("ddl_built", "False: unisum does not use IBM DDL.")
cuda_built = _answers_false("cuda_built", "False: this build of unisum.torch takes CPU tensors.")
rocm_built = _answers_false("rocm_built", "False: this build of unisum.torch takes CPU tensors.")


def _reduce_flags(average: Optional[bool], op: Optional[int]) -> int:
    """The C flags of an allreduce (0 for Sum, AVERAGE, MIN, MAX, PRODUCT)
    from Horovod's `average` and `op` arguments."""
    if op is None:
        return _capi.AVERAGE if average is None or bool(average) else 0
    if average is not None:
        raise ValueError("unisum.torch: allreduce takes `op` or the older `average`, not both")
    flags = {Average: _capi.AVERAGE, Sum: 0, Min: _capi.MIN, Max: _capi.MAX,
             Product: _capi.PRODUCT}.get(op)
    if flags is not None:
        return flags
    if op == Adasum:
        raise NotImplementedError(
            "unisum.torch: Adasum is not implemented: Horovod defines it by its recursive "
            "pairwise combination of gradients, which a summing server does not reproduce "
            "exactly; use op=Average")
    raise ValueError("unisum.torch: unknown allreduce op %r" % (op,))


def _shaped_name(name: Optional[str], tensor: torch.Tensor) -> Optional[str]:
    """The C tensor name of a named Horovod collective: its name with dtype
    and size, because Horovod lets a name come back with another shape once
    its operation is done (unisum's own push_pull keeps one shape per
    name)."""
    return None if name is None else _t._shaped(name, tensor)


def _allreduce_start(tensor: torch.Tensor, average: Optional[bool], name: Optional[str],
                     op: Optional[int], prescale_factor: float, postscale_factor: float,
                     process_set: Optional[ProcessSet], inplace: bool) -> int:
    """Starts an allreduce; returns its handle (see allreduce_async)."""
    flags = _reduce_flags(average, op)
    pset = _t._pset_of(process_set)
    if flags == _capi.AVERAGE and not tensor.dtype.is_floating_point:
        # Horovod averages integers by scaling the sum in double and
        # truncating toward zero (the C library floors): a Sum, then that.
        flags = 0
        postscale_factor = postscale_factor / (_t.size() if pset == 0 else
                                               len(process_set.ranks))
    if prescale_factor != 1.0:
        if inplace:
            tensor.copy_(_t._scaled(tensor.detach(), prescale_factor))
        else:
            tensor = _t._scaled(tensor.detach(), prescale_factor)
    return _held(name, "allreduce",
                 lambda: _busy_as_value_error(
                     lambda: _t._start(tensor, flags == _capi.AVERAGE, _shaped_name(name, tensor),
                                       0, inplace, scale=float(postscale_factor), flags=flags,
                                       pset=pset)))


def allreduce_async(tensor: torch.Tensor, average: Optional[bool] = None,
                    name: Optional[str] = None, op: Optional[int] = None,
                    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: Optional[ProcessSet] = None) -> int:
    """Starts reducing `tensor` over all workers into a new tensor; returns
    a handle for poll() / synchronize().

    Args:
        tensor: The CPU tensor to reduce (float32, float64, float16,
            bfloat16, int32, int64).
        average: Horovod's older form of `op`: True is Average, False Sum.
        name: The tensor's name, the same on every worker (None: by the
            order of unnamed collectives).
        op: Average (the default), Sum, Min, Max or Product, each
            reduced on the servers.
        prescale_factor: Multiplies the input before the reduction.
        postscale_factor: Multiplies the result.
        process_set: A process set (add_process_set) whose members alone
            reduce (Average divides by their number); None or
            global_process_set for every worker.

    Raises:
        NotImplementedError: For op Adasum.
        ValueError: When both `average` and `op` are given.
        TypeError, UnisumError: As push_pull_async().
    """
    return _allreduce_start(tensor, average, name, op, prescale_factor, postscale_factor,
                            process_set, inplace=False)


def allreduce_async_(tensor: torch.Tensor, average: Optional[bool] = None,
                     name: Optional[str] = None, op: Optional[int] = None,
                     prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     process_set: Optional[ProcessSet] = None) -> int:
    """As allreduce_async, writing the result into `tensor` itself."""
    return _allreduce_start(tensor, average, name, op, prescale_factor, postscale_factor,
                            process_set, inplace=True)


class _AllreduceFn(torch.autograd.Function):
    """allreduce as an autograd function: the gradient of an allreduce is
    the allreduce of the gradient, with the same op and factors."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, average: Optional[bool], name: Optional[str],
                op: Optional[int], prescale: float, postscale: float,
                process_set: Any) -> torch.Tensor:
        ctx.args = (average, op, prescale, postscale, process_set)
        return _t.synchronize(_allreduce_start(tensor, average, name, op, prescale, postscale,
                                               process_set, inplace=False))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        average, op, prescale, postscale, process_set = ctx.args
        reduced = _t.synchronize(_allreduce_start(grad.contiguous(), average, None, op, prescale,
                                                  postscale, process_set, inplace=False))
        return reduced, None, None, None, None, None, None


def allreduce(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
              compression: Any = None, op: Optional[int] = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: Optional[ProcessSet] = None) -> torch.Tensor:
    """Reduces `tensor` over all workers and returns the result in a new
    tensor; differentiable.  The arguments are allreduce_async()'s, and
    `compression` is Compression.none or Compression.fp16 (the tensor
    travels as float16)."""
    if compression is not None and compression is not _t.Compression.none:
        sent, ctx = compression.compress(tensor)
        return compression.decompress(
            allreduce(sent, average, name, None, op, prescale_factor, postscale_factor,
                      process_set), ctx)
    if tensor.requires_grad and torch.is_grad_enabled():
        out: torch.Tensor = _AllreduceFn.apply(tensor, average, name, op,
                                               float(prescale_factor), float(postscale_factor),
                                               process_set)
        return out
    return _t.synchronize(allreduce_async(tensor, average, name, op, prescale_factor,
                                          postscale_factor, process_set))


def allreduce_(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
               op: Optional[int] = None, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0,
               process_set: Optional[ProcessSet] = None) -> torch.Tensor:
    """Reduces `tensor` over all workers in place and returns it."""
    return _t.synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                           postscale_factor, process_set))


def _grouped(tensors: Sequence[torch.Tensor], average: Optional[bool], name: Optional[str],
             op: Optional[int], prescale_factor: float, postscale_factor: float,
             process_set: Optional[ProcessSet], inplace: bool) -> List[torch.Tensor]:
    """Starts one allreduce per tensor (named NAME.i), then waits for all."""
    handles = [_allreduce_start(t, average, None if name is None else "%s.%d" % (name, i), op,
                                prescale_factor, postscale_factor, process_set, inplace)
               for i, t in enumerate(tensors)]
    return [_t.synchronize(h) for h in handles]


def grouped_allreduce(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                      name: Optional[str] = None, op: Optional[int] = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: Optional[ProcessSet] = None) -> List[torch.Tensor]:
    """allreduce of every tensor of the list, all in flight at once; returns
    the results in order.  Tensor i is named NAME.i when `name` is given."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        # Differentiable, one allreduce after the other.
        return [allreduce(t, average, None if name is None else "%s.%d" % (name, i), None, op,
                          prescale_factor, postscale_factor, process_set)
                for i, t in enumerate(tensors)]
    return _grouped(tensors, average, name, op, prescale_factor, postscale_factor, process_set,
                    inplace=False)


def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                       name: Optional[str] = None, op: Optional[int] = None,
                       prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: Optional[ProcessSet] = None) -> List[torch.Tensor]:
    """grouped_allreduce in place: each tensor receives its own result."""
    return _grouped(tensors, average, name, op, prescale_factor, postscale_factor, process_set,
                    inplace=True)


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
                    process_set: Optional[ProcessSet] = None) -> int:
    """Starts copying root_rank's `tensor` to every worker, into a new
    tensor; returns a handle for poll() / synchronize().  Every worker
    passes a tensor of the same shape and dtype.

    With a `process_set`, its members alone take part (root_rank, a
    global rank, one of them).

    Raises:
        TypeError, UnisumError: As push_pull_async().
    """
    pset = _t._pset_of(process_set)
    return _held(name, "broadcast",
                 lambda: _busy_as_value_error(
                     lambda: _t._broadcast_start(tensor, root_rank, _shaped_name(name, tensor),
                                                 inplace=False, pset=pset)))


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
                     process_set: Optional[ProcessSet] = None) -> int:
    """As broadcast_async, into `tensor` itself."""
    pset = _t._pset_of(process_set)
    return _held(name, "broadcast",
                 lambda: _busy_as_value_error(
                     lambda: _t._broadcast_start(tensor, root_rank, _shaped_name(name, tensor),
                                                 inplace=True, pset=pset)))


class _BroadcastFn(torch.autograd.Function):
    """broadcast as an autograd function: as in Horovod, the gradient is
    averaged over the workers and kept on the root, zero elsewhere."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root_rank: int,
                name: Optional[str], process_set: Any) -> torch.Tensor:
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return _t.synchronize(broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        reduced = _t.synchronize(_allreduce_start(grad.contiguous(), True, None, None, 1.0, 1.0,
                                                  ctx.process_set, inplace=False))
        if _t.rank() != ctx.root_rank:
            reduced = reduced * 0
        return reduced, None, None, None


def broadcast(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
              process_set: Optional[ProcessSet] = None) -> torch.Tensor:
    """root_rank's `tensor` on every worker, in a new tensor; differentiable."""
    if tensor.requires_grad and torch.is_grad_enabled():
        out: torch.Tensor = _BroadcastFn.apply(tensor, root_rank, name, process_set)
        return out
    return _t.synchronize(broadcast_async(tensor, root_rank, name, process_set))


def broadcast_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
               process_set: Optional[ProcessSet] = None) -> torch.Tensor:
    """Overwrites `tensor` with root_rank's, in place, and returns it."""
    return _t.synchronize(broadcast_async_(tensor, root_rank, name, process_set))


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
    with _t._lock:
        if name in _names_in_flight:
            raise _NameInFlight("unisum.torch: %s: a collective named '%s' is already in "
                                "flight; wait for it first" % (what, name), _capi.EBUSY)
        _names_in_flight.add(name)

    def release() -> None:
        with _t._lock:
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
    with _t._lock:
        op = _t._ops.get(handle)
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
    return tensor if tensor.dtype in _t._DTYPES else tensor.to(torch.int32)


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
    wire = _t._in_set(grp.pset, name)

    def finish(_alive: torch.Tensor = buf) -> None:
        recv.reshape(-1).copy_(buf[lo:hi])
        after()
        _t._undeclare(wire)

    if buf.numel() == 0:
        finish()
        return None, lambda: None
    tid = _t._declared(wire, buf.dtype, buf.numel(), 0)
    h = ctypes.c_int64(0)
    try:
        with _t._starting(h):   # the caller runs _t._raise_kept once it is on record
            _capi.check(_capi.lib.unisum_push_pull_async(tid, buf.data_ptr(), buf.data_ptr(),
                                                         flags, ctypes.byref(h)),
                        "unisum.torch: " + kind)
    except BaseException:
        _t._undeclare(wire)
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
    tid = _t._declared(name, send.dtype, total, 0, shape)
    # An empty side still needs an address; nothing is read or written there.
    spare = torch.empty(1, dtype=send.dtype)

    def finish(_alive: torch.Tensor = spare) -> None:
        after()
        if not keep:
            _t._undeclare(name)

    if total == 0:
        finish()
        return None, lambda: None
    in_ptr = send.data_ptr() if send.numel() else spare.data_ptr()
    out_ptr = recv.data_ptr() if recv.numel() else spare.data_ptr()
    arr = (ctypes.c_uint64 * len(counts))(*counts)
    h = ctypes.c_int64(0)
    try:
        with _t._starting(h):   # the caller runs _t._raise_kept once it is on record
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
            _t._undeclare(name)
        raise
    return h.value, finish


# ---- the tensors that unnamed gathering collectives reuse ----
#
# A one-shot tensor costs three scheduler round trips a call (its
# declaration, the homed cut's, its undeclaration) and fresh buffers on the
# servers, whose first touch is page faults: 2-5 ms of a 4 MiB allgather's
# 35 ms on the emulated cluster.  So the allgathers and alltoalls of the
# global set take turns, by their count per kind (_exchange_start), on _SLOTS
# tensors per kind (2: with 4, 64 MiB allgathers ran 20-30% slower for
# their first 12 turns on the emulated cluster, cause not found; 2 still
# lets one call's data start while the last one's is in flight).  A slot's tensor
# carries one layout (dtype, counts); a call of another layout declares a
# new one, named after the call (which every rank agrees on, join()
# included), and undeclares the old.  Every rank sees the same layouts (the
# exchange said them, checked alike on every rank), and a call's stage runs
# only once every earlier call on its slot has ended here (its gate,
# _slot_free), so every rank runs a slot's calls in call order and names
# the same tensor for a call.  The C library keeps each tensor's homed cut:
# a call whose layout repeats declares nothing.  Results above _SLOT_BYTES
# stay one-shot (a slot's buffers on the servers outlive the call), and so
# do reducescatters: their layout comes from each rank's own tensor, so
# ranks that disagree must meet on one name to be refused (EMISMATCH).
# The exchanges take turns on _SHAPE_SLOTS tensors per kind; starting one
# waits for the slot's last exchange, which needs only every rank's call.
# An allgather whose slot's layout repeated may start its rows before its
# exchange (_speculate).
_SLOTS = 2
_SHAPE_SLOTS = 8
_SLOT_BYTES = 64 << 20


class _Slot:
    """One reused tensor: its current name and layout, and the handles of
    the calls filed on it, in call order."""

    __slots__ = ("kind", "index", "name", "layout", "users", "hits", "ahead", "retired", "next")

    def __init__(self, kind: str, index: int) -> None:
        self.kind, self.index = kind, index
        self.name: Optional[str] = None
        self.layout: Any = None         # (dtype, counts, the result's shape)
        self.users: List[int] = []
        self.hits = 0                   # calls since the last new layout
        # A round of its tensor that no call waits for (a speculation whose
        # layout did not hold), ended before the slot's next call runs.
        self.ahead: Optional[_Spec] = None
        self.retired: Optional[str] = None     # its old tensor, undeclared once ahead ends
        # Its next call's round, begun without this rank's rows (_slot_next).
        self.next: Optional[_Spec] = None


_slots: dict = {}


def _slot(kind: str, call: int, turns: int) -> _Slot:
    """The slot of kind `kind` that call number `call` takes."""
    with _t._lock:
        key = (kind, call % turns)
        got = _slots.get(key)
        if got is None:
            got = _slots[key] = _Slot(kind, call % turns)
        return got


_turns: dict = {}   # kind -> the global set's calls of that kind so far (slots' turns)


def _slot_file(slot: Optional[_Slot], handle: int) -> int:
    """Files `handle` as `slot`'s latest user; returns it."""
    if slot is not None:
        with _t._lock:
            slot.users.append(handle)
    return handle


def _slot_end_ahead(slot: _Slot) -> None:
    """Waits for the slot's round that no call waits for, if any, and
    undeclares the tensor it ran on."""
    if slot.ahead is not None:
        slot.ahead.drain()
        slot.ahead = None
    if slot.retired is not None:
        retired, slot.retired = slot.retired, None
        _t._undeclare(retired)


def _slot_free(slot: _Slot, handle: Optional[int]) -> None:
    """The gate of call `handle` on `slot` (None: a call not filed yet):
    waits until every call filed on it before (their stages ran: they
    came first) has ended here (each needs only the other ranks' stages,
    which they start in call order too), and forgets them."""
    _slot_end_ahead(slot)
    with _t._lock:
        if handle is None:
            earlier = list(slot.users)
        else:
            earlier = slot.users[:slot.users.index(handle)] if handle in slot.users else []
    for h in earlier:
        with _t._lock:
            op = _t._ops.get(h)
        if op is not None:
            _t._settle(h, op)
    with _t._lock:
        slot.users = [h for h in slot.users if h not in earlier]


def _gate(slot: Optional[_Slot], handle: int) -> Optional[Callable[[], None]]:
    """The gate of call `handle`'s stage: `slot` free (None: no slot)."""
    return None if slot is None else (lambda: _slot_free(slot, handle))


def _slot_wire(slot: Optional[_Slot], one_shot: str, send: torch.Tensor,
               counts: List[int], shape: Optional[Sequence[int]] = None) -> Tuple[str, bool]:
    """The tensor a call runs its `counts` of `send`'s dtype on (into a
    result of `shape`, when every rank's is the same), and whether it is a slot's (kept declared):
    `slot`'s, unless the whole exceeds _SLOT_BYTES or there is no slot (a
    process set); else `one_shot`, the call's own name.  A slot's new
    tensor is named after it, which every rank agrees on (join() included)
    and no call reuses.  Runs in the call's stage, its gate open."""
    if slot is None or sum(counts) * send.element_size() > _SLOT_BYTES:
        return one_shot, False
    layout = (send.dtype, tuple(counts), None if shape is None else tuple(shape))
    if slot.name is None or slot.layout != layout:
        if slot.name is not None:
            _t._undeclare(slot.name)
        slot.name = "unisum.%s.slot%d" % (one_shot, slot.index)
        slot.layout, slot.hits = layout, 0
    else:
        slot.hits += 1
    return slot.name, True


class _Spec:
    """An allgather started on its slot's layout before the shapes'
    exchange has said whether that layout holds (allgather_async): its C
    handle (None once its call took it over or it ended) and buffers.
    Until then it is in _specs, so its buffers live while the C
    library writes into them, whatever happens to the call."""

    __slots__ = ("handle", "send", "recv", "finish")

    def __init__(self, handle: int, send: torch.Tensor, recv: torch.Tensor,
                 finish: Callable[[], None]) -> None:
        self.handle: Optional[int] = handle
        self.send, self.recv, self.finish = send, recv, finish

    def take(self) -> Tuple[Optional[int], Callable[[], None]]:
        """Its C handle and finish, for the call's stage to wait on: the
        layout held."""
        handle, self.handle = self.handle, None
        with _t._lock:
            _specs.discard(self)
        return handle, self.finish

    def abandon(self) -> None:
        """Lets it go when its call failed before its stage: released if
        it has ended, else left in _specs (its buffers held) rather than
        waited for, since the others may never run its round."""
        if self.handle is not None and _t._poll(self.handle, 0) != 0:
            self.handle = None
        if self.handle is None:
            with _t._lock:
                _specs.discard(self)

    def drain(self) -> None:
        """Waits until it has ended, unless taken over or ended (every rank
        started its round, so it ends or fails in bounded time).  In
        slices, so that Ctrl-C can interrupt; it then stays in flight."""
        while self.handle is not None:
            rc = 0
            try:
                rc = _t._poll(self.handle, _t._WAIT_SLICE_MS)
            finally:
                if rc != 0:
                    self.handle = None  # done or failed: released either way
        with _t._lock:
            _specs.discard(self)


_specs: set = set()
# Speculations, those whose layout held, and those on a round begun before the call.
_spec_counts = {"started": 0, "held": 0, "begun": 0}


def _slot_busy(slot: _Slot) -> bool:
    """Whether a call filed on `slot` has not ended here."""
    with _t._lock:
        return any(h in _t._ops and not _t._ops[h].done for h in slot.users)


def _may_speculate(slot: _Slot) -> bool:
    """Whether an allgather on `slot` starts its rows before the shapes'
    exchange has said the layout (_speculate): when the slot's last call
    repeated the layout before it (in training shapes rarely change), so
    the rows need not wait for the exchange's round trip.  Only once the
    slot's last call has ended here (its stage run, its operation done),
    so it never waits: ranks may decide differently, and each says in its
    exchange row whether it does.  Every rank's stage then knows (see
    allgather_async): the layout held, and the others run that same round
    of the tensor; or it changed, and they run that round with zeros, so
    every speculation ends, before the new layout.  Only with one worker a
    machine (every machine has as many): the workers of a machine start
    their operations in one order (their local reduce takes them so),
    which decisions that differ would break."""
    if _capi.lib.unisum_local_size() > 1:
        return False
    if slot.ahead is not None:
        slot.ahead.abandon()    # released if it has ended
        if slot.ahead.handle is not None:
            return False
    if _slot_busy(slot):
        return False
    _slot_free(slot, None)      # forgets its ended calls
    return slot.name is not None and slot.hits >= 1


def _speculate(slot: _Slot, src: Optional[torch.Tensor], grp: _Group) -> Optional[_Spec]:
    """Starts the allgather of `src` on `slot`'s tensor in its layout (a
    rank whose tensor does not fit it, or without one, pushes zeros), or
    supplies it to the round begun already (`slot.next`); None when
    refused (a rank joined: the exchange says so) or there is nothing to
    move."""
    dtype, counts, shape = slot.layout
    send = _widened(src) if src is not None else None
    if send is None or send.dtype != dtype or send.numel() != counts[grp.k]:
        send = torch.zeros(counts[grp.k], dtype=dtype)
    if slot.next is not None:
        # Every caller holds SIGINT (allgather_async, a stage, join()):
        # the round gets its rows here or stays the slot's.
        spec = slot.next
        spec.send = send
        _capi.check(_capi.lib.unisum_allgather_supply(cast(int, spec.handle), send.data_ptr()),
                    "unisum.torch: allgather")
        slot.next = None
        return spec
    recv = _t._result(shape, dtype)
    try:
        handle, finish = _gather_launch("allgather", cast(str, slot.name), send, recv,
                                        list(counts), lambda: None, keep=True)
    except _capi.UnisumError:
        return None
    if handle is None:
        return None
    spec = _Spec(handle, send, recv, finish)
    with _t._lock:
        _specs.add(spec)
    return spec


def _slot_next(slot: _Slot) -> None:
    """Begins the round of `slot`'s next call now, without this rank's rows
    (unisum_allgather_begin): this machine's pulls of the others' rows go
    out at once, so a late rank's inbound data flows before its call
    instead of after it (bench/README.md).  Its next call speculates on
    it (_speculate supplies the rows, or zeros), and says so in its
    exchange, so a layout that changed or a refused call still runs that
    round on every rank.  Only when the slot's calls have all ended here
    and the layout repeated (_may_speculate's conditions), one worker a
    machine.  Run by synchronize() as the slot's last call returns (a
    Ctrl-C as it starts is raised there, the call's handle kept for a
    retry)."""
    if (slot.next is not None or slot.ahead is not None or slot.retired is not None
            or slot.name is None or slot.hits < 1 or not _t._initialized
            or _capi.lib.unisum_local_size() > 1 or _slot_busy(slot)):
        return
    dtype, counts, shape = slot.layout
    total = sum(counts)
    if total == 0:
        return
    tid = _t._declared(slot.name, dtype, total, 0)
    recv = _t._result(shape, dtype)
    arr = (ctypes.c_uint64 * len(counts))(*counts)
    h = ctypes.c_int64(0)
    # A Ctrl-C waits until the round is on record (the slot's), then
    # comes from synchronize(), its call's handle still there.
    with _t._SigintHold(later=True) as hold:
        rc = _capi.lib.unisum_allgather_begin(tid, recv.data_ptr(), arr, ctypes.byref(h))
        if rc == 0:
            spec = _Spec(h.value, recv, recv, lambda: None)
            with _t._lock:
                _specs.add(spec)
            slot.next = spec
    hold.deliver()      # else the next call speculates as it would have


def _exchange_start(table: torch.Tensor, grp: _Group, kind: str) -> Tuple[int, int]:
    """Starts the small push_pull (a sum) of `table`, in which each rank
    filled its own row, that a gathering collective waits for (a Ctrl-C as
    it starts stays held: the caller raises it with _t._raise_kept once
    the call is chained); returns its
    handle and the call's turn, its number among the global set's calls of
    `kind` (which slots it takes; 0 in a process set, which has none),
    counted once the push_pull has started.  In the global set it runs on
    the exchange slot of its turn, once the slot's last exchange is done
    (which needs only every rank's call)."""
    if grp.pset != 0:
        return _t._start(table, False, None, 0, False, pset=grp.pset, raise_kept=False), 0
    with _t._lock:
        turn = _turns.get(kind, 0) + 1
    slot = _slot(kind + ".exchange", turn, _SHAPE_SLOTS)
    with _t._lock:
        earlier = list(slot.users)
    for h in earlier:
        # Its push_pull done (released), unless its stage ran already:
        # needs only every rank's call.
        with _t._lock:
            op = _t._ops.get(h)
        if op is not None and op.then is not None:
            _t._step(op, True)
    with _t._lock:
        slot.users = [h for h in slot.users if h not in earlier]
    handle = _slot_file(slot, _t._start(table, False, "unisum.%s.exchange.slot%d.%d"
                                         % (kind, slot.index, table.numel()), 0, False,
                                         raise_kept=False))
    with _t._lock:
        _turns[kind] = turn
    return handle, turn


def _slots_forget(rejoin: bool) -> List[Any]:
    """After rejoin() (the tensors gone with the membership, the calls
    counted afresh), forgets every slot.  After join() (which every rank
    calls, none in a gathering collective), undeclares the collectives'
    slot tensors, one of which join may have poisoned; the next use
    declares a new one under its call number.  The exchange slots stay: a
    joined rank ran their push_pulls for the others, so their rounds are
    in step.  Returns what the caller holds until the C library has ended
    the membership's operations (rejoin: the speculative rounds, whose
    buffers it may still write)."""
    with _t._lock:
        if rejoin:
            held = list(_specs) + [slot.ahead for slot in _slots.values()]
            _slots.clear()
            _turns.clear()
            _specs.clear()      # rounds of the old membership's tensors
            return held
        retired = [slot for slot in _slots.values() if not slot.kind.endswith(".exchange")
                   and (slot.name is not None or slot.retired is not None)]
    for slot in retired:
        # Their operations ended (unisum_join waited for them); their
        # handles are released here, or the tensor would still be busy.
        for h in slot.users:
            with _t._lock:
                op = _t._ops.get(h)
            if op is not None and op.then is None:
                _t._step(op, True)
        _slot_end_ahead(slot)   # every rank started it (unisum_join waited too)
        if slot.next is not None:
            # Begun for a call that never came: unisum_join supplied
            # nothing, on every rank, so it ends.
            slot.next.drain()
            slot.next = None
        name, slot.name, slot.layout, slot.users, slot.hits = slot.name, None, None, [], 0
        if name is not None:
            _t._undeclare(name)
    return []


def _chain(first: int, stage: Callable[[_t._Op], Optional[int]],
           release: Callable[[], None], pset: int,
           gate: Optional[Callable[[], None]] = None) -> int:
    """Makes the operation of handle `first` (a small push_pull whose result
    the collective needs) run `stage` once it is done: `stage` sets the
    operation's buffers and output and returns the C handle of the
    collective itself (None: nothing to wait for).  `release` runs when the
    whole operation ends, however it ends.  Stages run in call order per
    process set `pset` (_t._stages_through), each once its push_pull is
    done and `gate` (if any) lets it."""
    with _t._lock:
        op = _t._ops[first]
    first_finish = op.finish

    def end_first() -> None:
        try:
            first_finish()
        finally:
            release()

    op.finish = end_first

    def then(op_: _t._Op) -> Optional[int]:
        first_finish()          # the small push_pull's own clean-up
        op_.finish = release
        c, finish = stage(op_)

        def end() -> None:
            try:
                finish()
            finally:
                release()
        op_.finish = end
        return c

    op.then, op.gate = then, gate
    _t._pend(first, pset)
    return first


def allgather_async(tensor: torch.Tensor, name: Optional[str] = None,
                    process_set: Optional[ProcessSet] = None) -> int:
    """Starts concatenating every rank's `tensor` along the first dimension
    (which may differ by rank; the others and the dtype may not); returns
    a handle for synchronize(), which returns the result.  Does not wait:
    the ranks' shapes are exchanged first (as Horovod's coordinator does),
    then the rows (when the layout repeats, the rows start at once, and
    the exchange confirms it: _speculate).  On the servers: each machine
    pushes only its rows and pulls the others'.

    With a `process_set`, its members' tensors, in the order of their
    ranks.

    Raises:
        ValueError: For a `name` that has a collective in flight.  A
            tensor of no dimensions, or of a dtype that cannot be
            gathered, fails at synchronize() on every rank (ValueError or
            TypeError here, HorovodInternalError on the others).
    """
    if _Group(process_set).pset != 0:
        return _allgather_start(tensor, name, process_set)
    with _t._lock:
        turn = _turns.get("allgather", 0) + 1
    if _slot("allgather", turn, _SLOTS).next is None:
        return _allgather_start(tensor, name, process_set)
    # This call takes a round begun for it (_slot_next): from its
    # exchange, which says this rank speculates, to the supply of its rows
    # a Ctrl-C waits, or that round would never get them here (and the
    # slot's next call would supply it with its own).  Its exchange may
    # first wait for its slot's exchange 8 calls back, which every rank
    # has made.
    hold = _t._SigintHold(later=True)
    try:
        with hold:
            return _allgather_start(tensor, name, process_set)
    finally:
        hold.deliver()


def _allgather_start(tensor: torch.Tensor, name: Optional[str],
                     process_set: Optional[ProcessSet]) -> int:
    """allgather_async's work."""
    grp = _Group(process_set)
    _host_only(tensor, "allgather")
    src = tensor.detach().contiguous()
    refused = _refusal(lambda: _record_check(src, "allgather"))
    release = _claim_name(name, "allgather")
    slot: Optional[_Slot] = None
    try:
        bet = False
        if grp.pset == 0:
            with _t._lock:
                turn = _turns.get("allgather", 0) + 1     # the exchange's, below
            slot = _slot("allgather", turn, _SLOTS)
            # A round begun for this call (_slot_next) is a speculation
            # already, also for a refused call (it runs with zeros).
            bet = slot.next is not None or (refused is None and _may_speculate(slot))
        # Its rows, then whether it speculates.
        table = _records(src, grp,
                         [src.shape[0] if src.dim() else 0, int(bet)], refused, [0, int(bet)])
        first, turn = _exchange_start(table, grp, "allgather")
    except BaseException:
        release()
        raise
    # Reserved once it started: every rank in the same order.
    data_name = _t._by_order("allgather", pset=grp.pset)
    spec: Optional[_Spec] = None        # set below, once the call is on record

    def unspeculate() -> None:
        """Some rank speculated on a layout that did not hold (or the call
        fails): every rank runs that round of the slot's tensor (the
        others with zeros), left in flight as the slot's `ahead`, which
        the slot's next call ends first (its gate), and then undeclares
        that tensor; this call goes on with a new one.  So no stage waits
        on the others' stages, and poll() never waits for data."""
        assert slot is not None
        if spec is not None:
            slot.ahead = spec
        else:
            dtype, counts, _ = slot.layout
            slot.ahead = _speculate(slot, torch.zeros(counts[grp.k], dtype=dtype), grp)
        slot.retired, slot.name = slot.name, None

    def stage(op: _t._Op) -> Tuple[Optional[int], Callable[[], None]]:
        recs = op.output.tolist()
        speculated = any(rec[1] for rec in recs)
        try:
            rows = [rec[0] for rec in _agreed(recs, "allgather", 2, grp, refused)]
        except Exception:
            if speculated:
                unspeculate()
                # A Ctrl-C as the zero round started is not kept for a
                # later call: this one raises already.
                _t._kept.e = None
            raise
        trailing = list(src.shape[1:])
        per_row = math.prod(trailing)
        send = _widened(src)
        shape = [sum(rows)] + trailing
        counts = [q * per_row for q in rows]
        held = slot is not None and slot.layout == (send.dtype, tuple(counts), tuple(shape))
        recv = spec.recv if spec is not None and held else _t._result(shape, send.dtype)
        output = recv if send is src else _t._result(recv.shape, src.dtype)

        def after() -> None:
            if output is not recv:
                output.copy_(recv)

        op.send, op.recv, op.output = send, recv, output
        if speculated and not held:
            unspeculate()
        if spec is None or not held:
            wire, keep = _slot_wire(slot, data_name, send, counts, shape)
            return _gather_launch("allgather", wire, send, recv, counts, after, 0, grp,
                                  keep=keep)
        # The layout held: the others run (or ran) this same round.
        assert slot is not None
        slot.hits += 1
        _spec_counts["held"] += 1
        op.send, op.recv, op.output = spec.send, recv, output
        handle, finish = spec.take()

        def done() -> None:
            finish()
            after()
        return handle, done

    def end() -> None:
        try:
            if spec is not None:
                spec.abandon()  # the call failed before its stage took it
        finally:
            release()

    handle = _chain(_slot_file(slot, first), stage, end, grp.pset, _gate(slot, first))
    if bet:
        # The rows start now, on the slot's layout, before the exchange has
        # said it (kept in _specs: its buffers live whatever happens).  A
        # rank that said it would and does not acts as one that did not.
        begun = cast(_Slot, slot).next is not None
        spec = _speculate(cast(_Slot, slot), src if refused is None else None, grp)
        if spec is not None:
            with _t._lock:
                _spec_counts["started"] += 1
                _spec_counts["begun"] += int(begun)
    if slot is not None:
        # Once this call has ended, the slot's next call begins its round.
        with _t._lock:
            _t._ops[handle].settled = lambda: _slot_next(cast(_Slot, slot))
    _t._raise_kept()    # a Ctrl-C as the exchange or the rows started: on record now
    return handle


class _AllgatherFn(torch.autograd.Function):
    """allgather as an autograd function: as in Horovod, the gradient is the
    average over the ranks of the gradient, narrowed to this rank's rows."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: Optional[str],
                process_set: Any) -> torch.Tensor:
        ctx.dim, ctx.process_set = tensor.shape[0] if tensor.dim() else 0, process_set
        return _t.synchronize(allgather_async(tensor, name, process_set))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        reduced = allreduce(grad.contiguous(), average=True, process_set=ctx.process_set)
        dims = allgather(torch.tensor([ctx.dim], dtype=torch.int64),
                         process_set=ctx.process_set)
        offset = int(dims[:_Group(ctx.process_set).k].sum().item())
        return reduced.narrow(0, offset, ctx.dim), None, None


def allgather(tensor: torch.Tensor, name: Optional[str] = None,
              process_set: Optional[ProcessSet] = None) -> torch.Tensor:
    """Every rank's `tensor` concatenated along the first dimension, in rank
    order; differentiable.  See allgather_async()."""
    if tensor.requires_grad and torch.is_grad_enabled():
        out: torch.Tensor = _AllgatherFn.apply(tensor, name, process_set)
        return out
    return _t.synchronize(allgather_async(tensor, name, process_set))


def grouped_allgather(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                      process_set: Optional[ProcessSet] = None) -> List[torch.Tensor]:
    """allgather of each tensor of the list; returns the results in order."""
    return _every([lambda i=i, t=t: allgather(t, None if name is None else "%s.%d" % (name, i),
                                              process_set)
                   for i, t in enumerate(tensors)])


def allgather_object(obj: Any, name: Optional[str] = None,
                     process_set: Optional[ProcessSet] = None) -> List[Any]:
    """Every rank's picklable `obj` (of a `process_set`: its members'), in
    rank order."""
    data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
    sizes = allgather(torch.tensor([data.numel()], dtype=torch.int64),
                      process_set=process_set).tolist()
    gathered = allgather(data, process_set=process_set)
    out, at = [], 0
    for n in sizes:
        out.append(pickle.loads(gathered[at:at + n].numpy().tobytes()))
        at += n
    return out


def _my_rows(rows: int, grp: _Group) -> Tuple[int, int]:
    """This rank's first row and row count of a tensor of `rows` rows split
    over the group's ranks as torch.tensor_split does."""
    n, r = grp.n, grp.k
    base, extra = divmod(rows, n)
    return r * base + min(r, extra), base + (1 if r < extra else 0)


def reducescatter_async(tensor: torch.Tensor, name: Optional[str] = None, op: Optional[int] = None,
                        process_set: Optional[ProcessSet] = None, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0) -> int:
    """Starts reducing `tensor` over the ranks (Average, or Sum) and keeping
    this rank's rows of the result; returns a handle for synchronize().  On
    the servers: every machine pushes the whole tensor and pulls only its
    ranks' rows.  With a `process_set`, over its members (their rows in
    the order of their ranks)."""
    grp = _Group(process_set)
    _host_only(tensor, "reducescatter")
    op = Average if op is None else op
    if op not in (Average, Sum) or tensor.dim() == 0 or tensor.dtype not in _t._DTYPES:
        # Its call number is used up all the same: this rank's next call
        # must not meet the others' call of this one (their sums would mix
        # two calls' tensors).  In the global set this rank declares that
        # call's tensor as one float16, which the others' is not unless it
        # holds just that: the scheduler refuses it on every rank
        # (EMISMATCH, naming both).  Else (or in a process set) the others
        # wait for this rank until it exits, or name it in a stall report.
        called = _t._by_order("reducescatter", pset=grp.pset)
        if grp.pset == 0:
            try:
                _t._declared(called, torch.float16, 1, 0)
                _t._undeclare(called)
            except UnisumError:
                pass    # another rank declared it first: refused here, and there
        if op not in (Average, Sum):
            raise NotImplementedError("unisum.torch: reducescatter takes op=Average or op=Sum, "
                                      "as Horovod's does; got %s" % _OP_NAMES.get(op, op))
        if tensor.dim() == 0:
            raise ValueError("unisum.torch: reducescatter needs a tensor of at least one "
                             "dimension")
        raise TypeError("unisum.torch: reducescatter of %s tensors is not supported; use one of %s"
                        % (tensor.dtype, ", ".join(str(d) for d in _t._DTYPES)))
    src = tensor.detach()
    if prescale_factor != 1.0:
        src = _t._scaled(src, prescale_factor)
    send = src.contiguous()
    n, rows = grp.n, send.shape[0]
    trailing = list(send.shape[1:])
    per_row = math.prod(trailing)
    base, extra = divmod(rows, n)
    counts = [(base + (1 if q < extra else 0)) * per_row for q in range(n)]
    _, mine = _my_rows(rows, grp)
    recv = _t._result([mine] + trailing, send.dtype)

    def after() -> None:
        if postscale_factor != 1.0:
            recv.copy_(_t._scaled(recv, postscale_factor))

    release = _claim_name(name, "reducescatter")
    try:
        c, finish = _gather_launch("reducescatter", _t._by_order("reducescatter", pset=grp.pset),
                                   send, recv, counts, after,
                                   _capi.AVERAGE if op == Average else 0, grp, tuple(send.shape))
    except BaseException:
        release()
        raise

    def end() -> None:
        try:
            finish()
        finally:
            release()

    if c is None:
        end()
        return _t._register(_t._Op(None, None, None, recv, lambda: None), done=True)
    handle = _t._register(_t._Op(c, send, recv, recv, end))
    _t._raise_kept()   # a Ctrl-C as it started: it is on record now
    return handle


class _ReducescatterFn(torch.autograd.Function):
    """reducescatter as an autograd function: as in Horovod, the gradient is
    the allgather of the gradient, scaled by size() for Sum and by the
    factors."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: Optional[str], op: int, pre: float,
                post: float, process_set: Any) -> torch.Tensor:
        ctx.args = (op, pre, post, process_set)
        return _t.synchronize(reducescatter_async(tensor, name, op, process_set, pre, post))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        op, pre, post, process_set = ctx.args
        grad = grad * (_Group(process_set).n if op == Sum else 1) * pre * post
        return allgather(grad.contiguous(), process_set=process_set), None, None, None, None, None


def reducescatter(tensor: torch.Tensor, name: Optional[str] = None, compression: Any = None,
                  op: Optional[int] = None, process_set: Optional[ProcessSet] = None,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> torch.Tensor:
    """This rank's rows of the reduction (Average, or Sum) of `tensor` over
    the ranks; differentiable.  See reducescatter_async()."""
    op = Average if op is None else op
    if compression is not None and compression is not _t.Compression.none:
        sent, ctx = compression.compress(tensor)
        return compression.decompress(
            reducescatter(sent, name, None, op, process_set, prescale_factor, postscale_factor),
            ctx)
    if tensor.requires_grad and torch.is_grad_enabled():
        out: torch.Tensor = _ReducescatterFn.apply(tensor, name, op, float(prescale_factor),
                                                   float(postscale_factor), process_set)
        return out
    return _t.synchronize(reducescatter_async(tensor, name, op, process_set, prescale_factor,
                                              postscale_factor))


def grouped_reducescatter(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                          op: Optional[int] = None, process_set: Optional[ProcessSet] = None,
                          prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> List[torch.Tensor]:
    """reducescatter of each tensor of the list, all in flight at once
    (one after the other, differentiable, when some tensor needs a grad)."""
    def named(i: int) -> Optional[str]:
        return None if name is None else "%s.%d" % (name, i)
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return _every([lambda i=i, t=t: reducescatter(t, named(i), None, op, process_set,
                                                       prescale_factor, postscale_factor)
                       for i, t in enumerate(tensors)])
    handles: List[int] = []
    failed: Optional[Exception] = None
    for i, t in enumerate(tensors):
        try:
            handles.append(reducescatter_async(t, named(i), op, process_set,
                                               prescale_factor, postscale_factor))
        except Exception as e:  # noqa: B902 (raised once the others are ended)
            failed = failed or e
    return _every([lambda h=h: _t.synchronize(h) for h in handles], failed)


def _every(calls: List[Callable[[], Any]], failed: Optional[Exception] = None) -> List[Any]:
    """Runs every call of a grouped collective, also after one raised: the
    other ranks run every one (each a call number of its kind), so
    skipping the rest would pair this rank's next calls with their earlier
    ones.  Then raises `failed` (an earlier error of the group), or the
    first exception; else returns the results."""
    out: List[Any] = []
    for call in calls:
        try:
            out.append(call())
        except Exception as e:  # noqa: B902 (raised below)
            failed = failed or e
    if failed is not None:
        raise failed
    return out


def alltoall_async(tensor: torch.Tensor, splits: Any = None, name: Optional[str] = None,
                   process_set: Optional[ProcessSet] = None) -> int:
    """Starts sending splits[j] rows of `tensor` (in order along the first
    dimension) to rank j, and receiving every rank's rows for this one, in
    rank order; synchronize() returns (the received rows, how many came
    from each rank).  Without `splits` the rows are split evenly.  On the
    servers: each machine pushes only its rows and pulls only those
    addressed to its ranks.  With a `process_set`, among its members:
    splits[j] rows go to its j-th rank.  A tensor of no dimensions, splits
    that do not fit it, or a dtype that cannot be sent, fail at
    synchronize() on every rank (ValueError or TypeError here,
    HorovodInternalError on the others)."""
    grp = _Group(process_set)
    _host_only(tensor, "alltoall")
    n, r = grp.n, grp.k
    mine = [0] * n

    def check() -> None:
        nonlocal mine
        if tensor.dim() == 0:
            raise ValueError("unisum.torch: alltoall needs a tensor of at least one dimension")
        rows = tensor.shape[0]
        if splits is None:
            if rows % n:
                raise ValueError("unisum.torch: alltoall without splits: the first dimension, "
                                 "%d, does not divide by size() = %d" % (rows, n))
            mine = [rows // n] * n
        else:
            # As Horovod: other than a tensor, converted to int32 (floats
            # truncated); a tensor must hold integers.
            try:
                given = (splits if isinstance(splits, torch.Tensor)
                         else torch.tensor(splits, dtype=torch.int32)).flatten()
            except (RuntimeError, TypeError, ValueError, OverflowError) as e:
                raise ValueError("unisum.torch: alltoall: splits %r are not a list of counts: %s"
                                 % (splits, e)) from None
            if given.is_floating_point() or given.is_complex() or given.dtype == torch.bool:
                raise ValueError("unisum.torch: alltoall: a splits tensor must hold integers (as "
                                 "Horovod's int32 splits), not %s" % given.dtype)
            got = [int(v) for v in given.tolist()]
            if len(got) != n or min(got) < 0 or sum(got) != rows:
                raise ValueError("unisum.torch: alltoall: splits %s must hold size() = %d "
                                 "non-negative counts that add up to the first dimension, %d"
                                 % (got, n, rows))
            mine = got
        _record_check(tensor, "alltoall")
    refused = _refusal(check)
    # Every rank's splits first (without waiting: the rows follow once
    # they are in), with its dimensions and dtype, checked alike on every
    # rank before the rows move.
    src = tensor.detach().contiguous()
    table = _records(src, grp, mine, refused)
    release = _claim_name(name, "alltoall")
    try:
        first, turn = _exchange_start(table, grp, "alltoall")
    except BaseException:
        release()
        raise
    # Reserved once it started: every rank in the same order.
    data_name = _t._by_order("alltoall", pset=grp.pset)
    slot = _slot("alltoall", turn, _SLOTS) if grp.pset == 0 else None

    def stage(op: _t._Op) -> Tuple[Optional[int], Callable[[], None]]:
        sent = _agreed(op.output.tolist(), "alltoall", n, grp, refused)   # sent[q][j]: q's rows for j
        trailing = list(src.shape[1:])
        per_row = math.prod(trailing)
        send = _widened(src)
        recv_rows = [sent[q][r] for q in range(n)]
        recv = _t._result([sum(recv_rows)] + trailing, send.dtype)
        out = recv if send is src else _t._result(recv.shape, src.dtype)

        def after() -> None:
            if out is not recv:
                out.copy_(recv)

        op.send, op.recv = send, recv
        op.output = (out, torch.tensor(recv_rows, dtype=torch.int32))
        counts = [sent[q][j] * per_row for q in range(n) for j in range(n)]
        wire, keep = _slot_wire(slot, data_name, send, counts)
        return _gather_launch("alltoall", wire, send, recv, counts, after, 0, grp, keep=keep)

    handle = _chain(_slot_file(slot, first), stage, release, grp.pset, _gate(slot, first))
    _t._raise_kept()    # a Ctrl-C as its exchange started: the call is on record now
    return handle


class _AlltoallFn(torch.autograd.Function):
    """alltoall as an autograd function: as in Horovod, the gradient goes
    back the way the rows came, by an alltoall with the received splits."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, splits: Any, name: Optional[str],
                process_set: Any) -> Any:
        out, recv = _t.synchronize(alltoall_async(tensor, splits, name, process_set))
        ctx.recv, ctx.process_set = recv, process_set
        ctx.mark_non_differentiable(recv)
        return out, recv

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, *unused: Any) -> Any:
        back, _ = _t.synchronize(alltoall_async(grad.contiguous(), ctx.recv, None,
                                                ctx.process_set))
        return back, None, None, None


def alltoall(tensor: torch.Tensor, splits: Any = None, name: Optional[str] = None,
             process_set: Optional[ProcessSet] = None) -> Any:
    """The rows every rank sends this one (see alltoall_async); with
    `splits`, also how many came from each rank.  Differentiable."""
    if tensor.requires_grad and torch.is_grad_enabled():
        out, recv = _AlltoallFn.apply(tensor, splits, name, process_set)
    else:
        out, recv = _t.synchronize(alltoall_async(tensor, splits, name, process_set))
    return out if splits is None else (out, recv)


def sparse_allreduce_async(tensor: torch.Tensor, name: Optional[str] = None,
                           op: Optional[int] = None,
                           process_set: Optional[ProcessSet] = None) -> Callable[[], torch.Tensor]:
    """Horovod's reduction of a sparse COO tensor: every rank's indices and
    values are allgathered (Average divides the values by the number of
    ranks first), and the returned function waits for both and gives the
    sparse sum, uncoalesced, as Horovod's does.

    Raises:
        ValueError: For a tensor that is not sparse, or an op other than
            Average and Sum.
    """
    if not tensor.is_sparse:
        raise ValueError("unisum.torch: sparse_allreduce_async takes a sparse COO tensor; use "
                         "allreduce_async for a dense one")
    op = Average if op is None else op
    if op not in (Average, Sum):
        raise ValueError("unisum.torch: sparse_allreduce_async takes op=Average or op=Sum")
    grp = _Group(process_set)
    _host_only(tensor, "sparse_allreduce")
    indices = tensor._indices().transpose(0, 1).contiguous()
    values = tensor._values()
    if op == Average:
        values = values / grp.n
    ih = allgather_async(indices, None if name is None else "%s.indices" % name, process_set)
    vh = allgather_async(values.contiguous(), None if name is None else "%s.values" % name,
                         process_set)
    size_ = tensor.size()

    def handle() -> torch.Tensor:
        gathered_values = _t.synchronize(vh)
        gathered_indices = _t.synchronize(ih)
        return torch.sparse_coo_tensor(gathered_indices.transpose(0, 1), gathered_values, size_)
    return handle


class _SyncBatchNormFn(torch.autograd.Function):
    """Batch normalisation with the statistics of every rank's batch: the
    counts, sums and sums of squares are allreduced (Sum) forward, and the
    two sums the input's gradient needs backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: Optional[torch.Tensor],
                bias: Optional[torch.Tensor], eps: float,
                stats_out: List[torch.Tensor]) -> torch.Tensor:
        c = x.shape[1]
        dims = [0] + list(range(2, x.dim()))
        xd = x.detach().double()
        local = torch.cat([torch.tensor([float(x.numel() // c)], dtype=torch.float64),
                           xd.sum(dims), (xd * xd).sum(dims)])
        total = allreduce(local, op=Sum)
        count = total[0]
        mean = total[1:1 + c] / count
        var = total[1 + c:] / count - mean * mean
        shape = [1, c] + [1] * (x.dim() - 2)
        invstd = 1.0 / torch.sqrt(var + eps)
        xhat = ((xd - mean.view(shape)) * invstd.view(shape)).to(x.dtype)
        out = xhat
        if weight is not None:
            out = out * weight.view(shape)
        if bias is not None:
            out = out + bias.view(shape)
        ctx.save_for_backward(xhat, weight, invstd.to(x.dtype))
        ctx.count, ctx.dims, ctx.shape = float(count), dims, shape
        stats_out.extend([mean, var, count])
        return out

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> Any:
        xhat, weight, invstd = ctx.saved_tensors
        dims, shape = ctx.dims, ctx.shape
        sum_dy = dy.sum(dims)
        sum_dy_xhat = (dy * xhat).sum(dims)
        grad_w = sum_dy_xhat if weight is not None and ctx.needs_input_grad[1] else None
        grad_b = sum_dy if ctx.needs_input_grad[2] else None
        grad_x = None
        if ctx.needs_input_grad[0]:
            both = allreduce(torch.cat([sum_dy, sum_dy_xhat]).double(), op=Sum)
            c = sum_dy.numel()
            mean_dy = (both[:c] / ctx.count).to(dy.dtype).view(shape)
            mean_dy_xhat = (both[c:] / ctx.count).to(dy.dtype).view(shape)
            scale = invstd.view(shape) * (weight.view(shape) if weight is not None else 1.0)
            grad_x = scale * (dy - mean_dy - xhat * mean_dy_xhat)
        return grad_x, grad_w, grad_b, None, None


class SyncBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    """Horovod's SyncBatchNorm: in training, batch normalisation over the
    union of every rank's batch (its mean and variance allreduced), on the
    CPU tensors unisum sums; in evaluation, the running statistics, which
    every rank keeps alike.  Every rank must call it in the same order."""

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError("unisum.torch: SyncBatchNorm expects an input of at least 2 "
                             "dimensions, got %d" % input.dim())

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        if not self.training and self.track_running_stats:
            return super().forward(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked)
        stats: List[torch.Tensor] = []
        out: torch.Tensor = _SyncBatchNormFn.apply(input, self.weight, self.bias, self.eps, stats)
        if self.training and self.track_running_stats and self.running_mean is not None:
            mean, var, count = stats
            unbiased = var * count / max(float(count) - 1.0, 1.0)
            with torch.no_grad():
                self.running_mean.mul_(1 - factor).add_(mean.to(self.running_mean.dtype) * factor)
                self.running_var.mul_(1 - factor).add_(unbiased.to(self.running_var.dtype) * factor)
        return out


def join(device: int = -1) -> int:
    """Horovod's join: this worker has no more data.  Until every worker
    has joined it contributes zeros to the allreduces the others run (an
    Average still divides by size()); their broadcasts and gathering
    collectives raise meanwhile.  Returns the rank that joined last, the
    same on every worker.  `device` is taken and unused (CPU tensors).

    A Ctrl-C while it waits comes once the join has ended (the C call
    cannot be stopped), and the next join() is taken for that one, retried:
    it returns its answer at once.

    Raises:
        UnisumError: When the job fails meanwhile.
    """
    global _join_kept
    del device
    _t._require_init()
    if _join_kept is not None:
        # The last call's join ended as a Ctrl-C came: this call is that
        # one (a new join would be one ahead of every other worker's).
        last, _join_kept = _join_kept, None
        return last
    # This worker's collectives begin before it joins: every second stage
    # runs first (the C library then waits for the operations themselves).
    _t._settle_stages()
    # unisum_join blocks until every worker has joined (a Ctrl-C cannot
    # stop it), and what follows it must all run: a Ctrl-C comes after,
    # and the next join() returns this one's answer.
    with _t._SigintHold():
        last = _capi.check(_capi.lib.unisum_join(), "unisum.torch.join")
        # A joined worker ran none of the others' unnamed collectives: every
        # worker takes the largest counts, so the next names and slots agree.
        kinds = ("allgather", "alltoall")
        with _t._lock:
            begun = [int(_slots.get(("allgather", i)) is not None
                         and _slots[("allgather", i)].next is not None) for i in range(_SLOTS)]
        counts = torch.tensor([_t._calls.get(0, 0)] + [_turns.get(k, 0) for k in kinds] + begun,
                              dtype=torch.int64)
        got = _t.synchronize(_t._start(counts, False, "unisum.join.counts", 0, True,
                                       flags=_capi.MAX)).tolist()
        with _t._lock:
            _t._calls[0] = int(got[0])
            _turns.update(zip(kinds, (int(v) for v in got[1:1 + len(kinds)])))
        # A slot's next round that some rank began (_slot_next) and this
        # one did not (its call ended after a rank had joined, say): this
        # one runs it with zeros, so that every rank's ends.
        for i, anyone in enumerate(got[1 + len(kinds):]):
            slot = _slots.get(("allgather", i))
            if anyone and slot is not None and slot.next is None and slot.name is not None:
                slot.next = _speculate(slot, None, _Group(None))
        # Every rank is here, none in a gathering collective: the slots start
        # afresh (one may hold a tensor that join poisoned).
        _slots_forget(rejoin=False)
        _join_kept = int(last)      # until it is returned: a held Ctrl-C comes first
    _join_kept = None
    return int(last)


# join(): the last call's join ended, but a Ctrl-C came before it returned.
_join_kept: Optional[int] = None
