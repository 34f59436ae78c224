"""Horovod's allreduce and broadcast (and their in-place, async, grouped and
differentiable forms) on push_pull.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

import torch

from unisum import _capi
from unisum.torch._core import rank, size
from unisum.torch.ops import _pset_of, _scaled, _start, synchronize
from unisum.torch.functions import _broadcast_start
from unisum.torch.compression import Compression
from unisum._horovod.basics import ProcessSet, _reduce_flags, _shaped_name
from unisum._horovod.common import _busy_as_value_error, _held


def _allreduce_start(tensor: torch.Tensor, average: Optional[bool], name: Optional[str],
                     op: Optional[int], prescale_factor: float, postscale_factor: float,
                     process_set: Optional[ProcessSet], inplace: bool) -> int:
    """Starts an allreduce; returns its handle (see allreduce_async)."""
    flags = _reduce_flags(average, op)
    pset = _pset_of(process_set)
    if flags == _capi.AVERAGE and not tensor.dtype.is_floating_point:
        # Horovod averages integers by scaling the sum in double and
        # truncating toward zero (the C library floors): a Sum, then that.
        flags = 0
        postscale_factor = postscale_factor / (size() if pset == 0 else
                                               len(process_set.ranks))
    if prescale_factor != 1.0:
        if inplace:
            tensor.copy_(_scaled(tensor.detach(), prescale_factor))
        else:
            tensor = _scaled(tensor.detach(), prescale_factor)
    return _held(name, "allreduce",
                 lambda: _busy_as_value_error(
                     lambda: _start(tensor, flags == _capi.AVERAGE, _shaped_name(name, tensor),
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
        return synchronize(_allreduce_start(tensor, average, name, op, prescale, postscale,
                                               process_set, inplace=False))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        average, op, prescale, postscale, process_set = ctx.args
        reduced = synchronize(_allreduce_start(grad.contiguous(), average, None, op, prescale,
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
    if compression is not None and compression is not Compression.none:
        sent, ctx = compression.compress(tensor)
        return compression.decompress(
            allreduce(sent, average, name, None, op, prescale_factor, postscale_factor,
                      process_set), ctx)
    if tensor.requires_grad and torch.is_grad_enabled():
        out: torch.Tensor = _AllreduceFn.apply(tensor, average, name, op,
                                               float(prescale_factor), float(postscale_factor),
                                               process_set)
        return out
    return synchronize(allreduce_async(tensor, average, name, op, prescale_factor,
                                          postscale_factor, process_set))


def allreduce_(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
               op: Optional[int] = None, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0,
               process_set: Optional[ProcessSet] = None) -> torch.Tensor:
    """Reduces `tensor` over all workers in place and returns it."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                           postscale_factor, process_set))


def _grouped(tensors: Sequence[torch.Tensor], average: Optional[bool], name: Optional[str],
             op: Optional[int], prescale_factor: float, postscale_factor: float,
             process_set: Optional[ProcessSet], inplace: bool) -> List[torch.Tensor]:
    """Starts one allreduce per tensor (named NAME.i), then waits for all."""
    handles = [_allreduce_start(t, average, None if name is None else "%s.%d" % (name, i), op,
                                prescale_factor, postscale_factor, process_set, inplace)
               for i, t in enumerate(tensors)]
    return [synchronize(h) for h in handles]


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
    pset = _pset_of(process_set)
    return _held(name, "broadcast",
                 lambda: _busy_as_value_error(
                     lambda: _broadcast_start(tensor, root_rank, _shaped_name(name, tensor),
                                                 inplace=False, pset=pset)))


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
                     process_set: Optional[ProcessSet] = None) -> int:
    """As broadcast_async, into `tensor` itself."""
    pset = _pset_of(process_set)
    return _held(name, "broadcast",
                 lambda: _busy_as_value_error(
                     lambda: _broadcast_start(tensor, root_rank, _shaped_name(name, tensor),
                                                 inplace=True, pset=pset)))


class _BroadcastFn(torch.autograd.Function):
    """broadcast as an autograd function: as in Horovod, the gradient is
    averaged over the workers and kept on the root, zero elsewhere."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root_rank: int,
                name: Optional[str], process_set: Any) -> torch.Tensor:
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return synchronize(broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        reduced = synchronize(_allreduce_start(grad.contiguous(), True, None, None, 1.0, 1.0,
                                                  ctx.process_set, inplace=False))
        if rank() != ctx.root_rank:
            reduced = reduced * 0
        return reduced, None, None, None


def broadcast(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
              process_set: Optional[ProcessSet] = None) -> torch.Tensor:
    """root_rank's `tensor` on every worker, in a new tensor; differentiable."""
    if tensor.requires_grad and torch.is_grad_enabled():
        out: torch.Tensor = _BroadcastFn.apply(tensor, root_rank, name, process_set)
        return out
    return synchronize(broadcast_async(tensor, root_rank, name, process_set))


def broadcast_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
               process_set: Optional[ProcessSet] = None) -> torch.Tensor:
    """Overwrites `tensor` with root_rank's, in place, and returns it."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))
