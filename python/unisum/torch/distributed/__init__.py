"""torch.distributed's backend "unisum": DDP and torch.distributed code
keep their calls, and their collectives run on unisum's Summation Service.

    import torch.distributed as dist
    import unisum.torch.distributed      # registers the backend "unisum"

    dist.init_process_group("unisum")    # under unisum launch, or torchrun
    model = torch.nn.parallel.DistributedDataParallel(model)

Where the job comes from:

* Under ``unisum launch`` (which exports torchrun's RANK, WORLD_SIZE,
  LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT), the group
  joins the launched job: its scheduler, its servers, its machines.  A
  rank or world size given to init_process_group must be the job's.
* Anywhere else (torchrun, or an explicit ``init_method``, ``rank`` and
  ``world_size``), rank 0 starts the scheduler and the first rank of every
  machine starts a server beside its workers, and every rank finds them
  through the store torch.distributed made for the group (see
  ``_bootstrap``): what torchrun's rendezvous does for its store.

The calls (``dist.X`` of a tensor on the CPU; CUDA tensors go through host
memory as unisum.torch's do):

=================================  ==========================================
all_reduce, all_reduce_coalesced   SUM, AVG, MIN, MAX, PRODUCT on the
                                   servers; BAND, BOR, BXOR, PREMUL_SUM
                                   refused
broadcast                          unisum's broadcast
all_gather, all_gather_into_tensor the C library's allgather (each machine
  (_allgather_base)                pulls only what it lacks)
reduce_scatter,                    the C library's reduce-scatter for SUM
  reduce_scatter_tensor            and AVG; other ops: an allreduce, sliced
all_to_all, all_to_all_single      the C library's alltoall; uneven splits
                                   first gather every rank's splits
reduce                             an allreduce (every rank gets the result)
gather, scatter                    an alltoall to or from the root alone
barrier                            a sum of one zero
monitored_barrier                  the group's method (torch 1.13's
                                   dist.monitored_barrier takes gloo only)
send, recv, isend, irecv           refused at once, naming what to use
new_group(ranks)                   a unisum process set of those ranks
=================================  ==========================================

Every call is asynchronous: the Work's ``wait()`` raises the operation's
error, or a timeout after the group's (``init_process_group(timeout=)``),
and returns to the interpreter every 100 ms (Ctrl-C); ``get_future()``
completes when the operation does.  A collective is named by its order
among the group's calls, as Horovod names unnamed ones, so every rank of a
group must make the same calls in the same order (torch.distributed asks
the same); ranks that pass different shapes fail, naming the tensor.
Dtypes: float32, float64, float16, bfloat16, int64, int32 as they are;
int16, int8, uint8 and bool carried as int32; complex as pairs of reals
(reductions SUM and AVG only).
"""

from __future__ import annotations

import datetime
from typing import Any

import torch.distributed as dist

import unisum.torch as _us
from unisum.torch import _core
from unisum.torch.distributed import _bootstrap
from unisum.torch.distributed._group import ProcessGroupUnisum
from unisum.torch.distributed._work import UnisumWork

__all__ = ["ProcessGroupUnisum", "UnisumWork", "BACKEND"]

BACKEND = "unisum"


def _create(store: Any, rank: int, size: int, timeout: datetime.timedelta) -> ProcessGroupUnisum:
    """torch.distributed's constructor of the backend: the default group
    joins (or starts) the job; a new_group's group is a subset of it."""
    if not dist.is_initialized():
        if not _core._initialized:
            if not _bootstrap.in_environment():
                _bootstrap.start_job(store, rank, size, timeout)
            _us.init()
        if rank != _us.rank() or size != _us.size():
            raise RuntimeError(
                "unisum: init_process_group was given rank %d of %d, but this worker is rank %d "
                "of %d in its unisum job (under unisum launch, leave rank and world_size out, "
                "or give the job's: RANK and WORLD_SIZE)" % (rank, size, _us.rank(), _us.size()))
    return ProcessGroupUnisum(rank, size, timeout)


if not hasattr(dist.Backend, BACKEND.upper()):
    dist.Backend.register_backend(BACKEND, _create)
