"""DDP communication hooks that sum DDP's buckets through unisum, for people
who keep another backend (gloo) as their process group:

    import torch.distributed as dist
    from unisum.torch import ddp_hooks

    dist.init_process_group("gloo")                  # under unisum launch
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp.register_comm_hook(ddp_hooks.State(), ddp_hooks.push_pull_hook)

Each bucket is averaged over the workers by a push_pull (unisum's servers,
and the machine's shared memory first), asynchronously: the hook returns a
future that the backend's completer thread (unisum.torch.distributed)
completes once the sum is back, so DDP overlaps the buckets with backward
as with its own allreduce hook.  The state holds the settings:

* ``State()``: the bucket as it is.
* ``State(compression=SPEC)`` with one of unisum's codecs (``unisum info``
  lists them; ``fp16_state()``, ``onebit_state()`` and ``topk_state()``
  build the usual ones): the machine's root compresses each partition,
  the server decompresses, sums in float32 and compresses the sum once,
  with error feedback on both sides where the spec asks (BytePS's
  two-level scheme, see unisum.torch.DistributedOptimizer).  Float32
  buckets only; a bucket of another dtype, or under 64 KiB, goes
  uncompressed.

A bucket is named by its index, dtype and size (``ddp.bucket3.float32[N]``),
the same on every worker, since DDP cuts buckets alike everywhere; DDP
re-cuts them after its first step, which only declares new names.  Its
priority is its index: DDP's last bucket holds the first layers, which the
next forward pass needs first.  unisum.torch.init() is called by the first
State if nothing has yet.
"""

from typing import Optional

import torch
import torch.distributed as dist

from unisum.torch import _core
from unisum.torch._runtime import init
from unisum.torch.ops import _start
from unisum.torch.distributed._work import future_of

__all__ = ["State", "push_pull_hook", "fp16_state", "onebit_state", "topk_state"]


class State:
    """The settings of push_pull_hook: the compression spec (None: none),
    and the prefix of the buckets' names (two DDP models trained side by
    side need two)."""

    def __init__(self, compression: Optional[str] = None, prefix: str = "ddp") -> None:
        if not _core._initialized:
            init()
        self.compression = None if compression in (None, "", "none") else compression
        self.prefix = prefix

    def __repr__(self) -> str:
        return "ddp_hooks.State(compression=%r, prefix=%r)" % (self.compression, self.prefix)


def fp16_state(prefix: str = "ddp") -> State:
    """Buckets travel as float16 (the codec rounds each value once)."""
    return State("fp16", prefix)


def onebit_state(scaling: bool = True, ef: str = "vanilla", prefix: str = "ddp") -> State:
    """BytePS's 1-bit compression (signs, scaled by the mean magnitude),
    with error feedback: what a round rounds away is added to the next."""
    return State("onebit,scaling=%d,ef=%s" % (1 if scaling else 0, ef), prefix)


def topk_state(k: float = 0.01, ef: str = "vanilla", prefix: str = "ddp") -> State:
    """The k largest magnitudes (a fraction, or a count when k >= 1), with
    error feedback."""
    return State("topk,k=%g,ef=%s" % (k, ef), prefix)


def push_pull_hook(state: Optional[State],
                   bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: averages the bucket over the workers through
    unisum; returns the future of the averaged bucket.  (The annotations
    are DDP's, which it checks: this module does not defer them.)"""
    if state is None:
        state = State()
    buf: torch.Tensor = bucket.buffer()
    spec = state.compression if buf.dtype == torch.float32 else None
    name = "%s.bucket%d.%s[%d]" % (state.prefix, bucket.index(),
                                   str(buf.dtype).replace("torch.", ""), buf.numel())
    handle = _start(buf, True, name, bucket.index(), inplace=True, compression=spec)
    return future_of("push_pull_hook", [handle], buf)
