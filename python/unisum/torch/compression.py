"""Gradient compression for DistributedOptimizer, with the names of
``byteps.torch.compression`` and ``horovod.torch.compression``.

A compressor is a class whose static methods compress() and decompress()
DistributedOptimizer calls around the sum of each gradient; pass the class
itself, as in ``compression=Compression.fp16``.  (The C library's own
compressors, BytePS's onebit, topk and the rest, are chosen with
DistributedOptimizer's ``compression_params`` instead.)
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "Compression"]


class Compressor:
    """What DistributedOptimizer's `compression` is: a class (or object)
    with these two functions."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> Tuple[torch.Tensor, Any]:
        """The tensor to sum instead of `tensor`, and a context for
        decompress()."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """The gradient that the sum `tensor` of compressed tensors stands
        for, given compress()'s context `ctx`."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """No compression: gradients are summed as they are."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> Tuple[torch.Tensor, None]:
        """Returns `tensor` itself and no context.

        Args:
            tensor: The gradient to sum.
        """
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: None) -> torch.Tensor:
        """Returns `tensor` itself.

        Args:
            tensor: The summed gradient.
            ctx: The context compress() returned (None).
        """
        return tensor


class FP16Compressor(Compressor):
    """Sends float gradients as float16: half the bytes."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> Tuple[torch.Tensor, Optional[torch.dtype]]:
        """Returns a float16 copy of a floating-point `tensor` of another
        dtype, with the original dtype as context; any other tensor
        itself, with None.

        Args:
            tensor: The gradient to sum.
        """
        if tensor.dtype.is_floating_point and tensor.dtype != torch.float16:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Optional[torch.dtype]) -> torch.Tensor:
        """Returns the summed `tensor` converted back to the dtype `ctx`,
        or `tensor` itself when `ctx` is None.

        Args:
            tensor: The summed gradient, as compress() returned it.
            ctx: The dtype compress() returned, or None.
        """
        return tensor if ctx is None else tensor.to(ctx)


class Compression:
    """The compressors by Horovod's and BytePS's names."""

    none = NoneCompressor
    """No compression."""

    fp16 = FP16Compressor
    """Float gradients travel as float16."""
