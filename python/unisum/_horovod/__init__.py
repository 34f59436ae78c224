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

from unisum._horovod.basics import (Adasum, Average, HorovodInternalError, Max, Min, ProcessSet,
                                    Product, Sum, add_process_set, ccl_built, cross_rank,
                                    cross_size, cuda_built, ddl_built, global_process_set,
                                    gloo_built, gloo_enabled, is_homogeneous, is_initialized,
                                    mpi_built, mpi_enabled, nccl_built, remove_process_set,
                                    rocm_built, unisum_built)
from unisum._horovod.reduce import (allreduce, allreduce_, allreduce_async, allreduce_async_,
                                    broadcast, broadcast_, broadcast_async, broadcast_async_,
                                    grouped_allreduce, grouped_allreduce_)
from unisum._horovod.gather import (allgather, allgather_async, allgather_object, alltoall,
                                    alltoall_async, grouped_allgather, grouped_reducescatter,
                                    reducescatter, reducescatter_async, sparse_allreduce_async)
from unisum._horovod.sync_batch_norm import SyncBatchNorm
from unisum._horovod.join import join

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
