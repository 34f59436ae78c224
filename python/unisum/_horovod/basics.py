"""Horovod's basics for unisum.torch: the ReduceOp values, process sets, and the
queries (is_initialized, cross_rank, the *_built and *_enabled answers).
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable, List, Optional, Sequence

import torch

from unisum import _capi
from unisum.torch import _core
from unisum.torch._core import _calls, _lock, _require_init, _tensors, local_size, rank, size
from unisum.torch.ops import _SET_TAG, _pset_of, _shaped
from unisum._capi import UnisumError


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
        return size() if self.process_set_id == 0 else len(self.ranks or [])

    def rank(self) -> Optional[int]:
        """This worker's place among the set's ranks (None before
        add_process_set(), or outside the set).  Collectives still take
        global ranks (broadcast's root_rank), as in Horovod."""
        if self.process_set_id is None:
            return None
        if self.process_set_id == 0:
            return rank()
        me = rank()
        return (self.ranks or []).index(me) if me in (self.ranks or []) else None

    def included(self) -> Optional[bool]:
        """Whether this worker is in the set."""
        if self.process_set_id == 0:
            return True
        return None if self.ranks is None else rank() in self.ranks

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
    _require_init()
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    ranks = process_set.ranks or []
    if ranks == list(range(size())):
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
    with _lock:
        for name in [n for n in _tensors if n.startswith("%s%d%s" % (_SET_TAG, pid,
                                                                          _SET_TAG))]:
            del _tensors[name]
        _calls.pop(pid, None)
    return _capi.lib.unisum_process_set_remove(int(pid)) == 0


class _Group:
    """Where a collective runs: process set `pset` (0: every worker), its
    member ranks in order, this worker's index among them."""

    def __init__(self, process_set: Any) -> None:
        self.pset = _pset_of(process_set)
        self.ranks = list(range(size())) if self.pset == 0 else list(process_set.ranks)
        me = rank()
        if me not in self.ranks:
            raise ValueError("unisum.torch: rank %d is not in %s" % (me, process_set))
        self.n, self.k = len(self.ranks), self.ranks.index(me)


def is_initialized() -> bool:
    """True between init() and shutdown()."""
    return _core._initialized


def cross_rank() -> int:
    """This worker's machine among the job's machines (Horovod's cross rank)."""
    return rank() // local_size()


def cross_size() -> int:
    """How many machines the job has (Horovod's cross size)."""
    return size() // local_size()


def is_homogeneous() -> bool:
    """True: every machine of a unisum job runs the same number of workers."""
    _require_init()
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
    return None if name is None else _shaped(name, tensor)
