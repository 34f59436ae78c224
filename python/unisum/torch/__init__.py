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

CPU tensors are summed where they lie; CUDA tensors go through host
staging buffers (``unisum._cuda``), as the C library sums host memory.  A
name maps to one dtype and element count on every worker; the keys come
from names, so workers may declare and push in any order.  Every failure
raises :class:`unisum.UnisumError` carrying the C library's message.

This module only re-exports: the state and the operations' machinery
live in ``_core``, memory in ``_memory``, the push_pulls in ``ops``,
joining and leaving in ``_runtime``, the broadcasts in ``functions``, the
optimizer in ``optimizer``, and Horovod's collectives in
``unisum._horovod``.

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
  exchanged and checked first: see ``unisum._horovod.slots``.)
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

from unisum._capi import UnisumError
from unisum.torch.compression import Compression
from unisum.torch._core import local_rank, local_size, rank, size
from unisum.torch._memory import empty, zeros_like
from unisum.torch.ops import (byteps_push_pull, declare, poll, push_pull, push_pull_,
                              push_pull_async, push_pull_async_inplace, push_pull_inplace,
                              synchronize)
from unisum.torch._runtime import (barrier, get_stats, init, membership_changed, rejoin, resume,
                                   shutdown, start_timeline, stop_timeline, suspend)
from unisum.torch.optimizer import DistributedOptimizer
from unisum.torch.functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters

__all__ = [
    "init", "shutdown", "size", "rank", "local_rank", "local_size", "declare",
    "push_pull", "push_pull_", "push_pull_async", "push_pull_async_inplace", "poll",
    "push_pull_inplace", "byteps_push_pull", "suspend", "resume", "start_timeline",
    "stop_timeline",
    "synchronize", "broadcast_parameters", "broadcast_optimizer_state",
    "broadcast_object", "barrier", "DistributedOptimizer", "Compression", "UnisumError",
    "empty", "zeros_like", "get_stats", "membership_changed", "rejoin", "elastic",
]

# Horovod's names (allreduce, broadcast, the queries, ReduceOp values):
# thin wrappers over the collectives above, in their own module.
from unisum._horovod import *  # noqa: E402, F401, F403
from unisum._horovod import __all__ as _horovod_all  # noqa: E402

__all__ += _horovod_all

# Elastic training (Horovod's hvd.elastic): run, State, TorchState, ...
from unisum.torch import elastic  # noqa: E402
