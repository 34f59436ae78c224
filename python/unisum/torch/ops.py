"""The operations of ``byteps.torch.ops``: push_pull and its forms, the
handles' poll and synchronize, declare, and the group-sync counting of
BytePS's DistributedDataParallel.

    import unisum.torch.ops as ops

Everything but the last two is ``unisum.torch``'s own function under the
same name.
"""

from __future__ import annotations

import threading
from typing import Optional, Tuple

import torch

from unisum.torch import (declare, init, local_rank, local_size, poll, push_pull,  # noqa: F401
                          push_pull_async, push_pull_async_inplace, push_pull_inplace, rank,
                          resume, shutdown, size, suspend, synchronize)

__all__ = ["init", "shutdown", "suspend", "resume", "size", "local_size", "rank", "local_rank",
           "push_pull_async", "push_pull", "push_pull_async_inplace", "push_pull_inplace",
           "push_pull_group_sync_inplace", "poll", "declare", "byteps_torch_set_num_grads",
           "synchronize"]

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
