"""BytePS's DistributedDataParallel (``byteps.torch.parallel``): a module
wrapper that push_pulls each gradient as autograd accumulates it.

It keeps BytePS's constructor (``module, device_ids=None,
broadcast_buffers=True, compression=Compression.none``), ``no_sync()`` and
``synchronize()``, and its behaviour:

* the constructor broadcasts rank 0's state_dict (parameters and
  buffers); with ``broadcast_buffers`` every forward() broadcasts rank 0's
  buffers first;
* a hook on each parameter's gradient accumulator starts the averaging
  push_pull of its ``.grad`` (named ``Gradient.<parameter name>``, the
  first layers' first, as unisum.torch.DistributedOptimizer orders them),
  and the hook of the last gradient of a backward pass waits for all of
  them, so ``loss.backward()`` returns with averaged gradients;
* a model whose forward skips some parameters calls ``synchronize()``
  after ``backward()``: it push_pulls the ones no hook started (their
  zero gradient where they have none) and waits;
* under ``no_sync()`` gradients accumulate locally; the first backward
  after it push_pulls the accumulated sum.

Where unisum differs: ``device_ids`` may be left out, and is ignored for a
module on the CPU (BytePS asserts one CUDA device); with one worker
nothing is push_pulled.
"""

from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch.nn import Module

from unisum.torch import _core
from unisum.torch._runtime import init
from unisum.torch.compression import Compression
from unisum.torch.functions import broadcast_parameters
from unisum.torch.ops import push_pull_async_inplace, synchronize


class DistributedDataParallel(Module):
    """BytePS's DistributedDataParallel on unisum (see the module docstring)."""

    def __init__(self, module: Module, device_ids: Optional[Sequence[Any]] = None,
                 broadcast_buffers: bool = True, compression: Any = Compression.none) -> None:
        super().__init__()
        if not _core._initialized:
            init()
        if device_ids is not None and len(device_ids) != 1:
            raise ValueError("unisum.torch.parallel.DistributedDataParallel: device_ids holds "
                             "one device (one process per GPU), got %r" % (device_ids,))
        self.device_ids = list(device_ids) if device_ids is not None else None
        self.module = module
        self.broadcast_buffers = broadcast_buffers
        self._compression = compression
        self._require_backward_grad_sync = True
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self._names: Dict[int, str] = {id(p): n for n, p in named}
        self._priority = {id(p): len(named) - i for i, (_, p) in enumerate(named)}
        self._params: List[torch.nn.Parameter] = [p for _, p in named]
        self._handles: Dict[int, Tuple[torch.nn.Parameter, int, Any, torch.Tensor]] = {}
        self._grad_accs: List[Any] = []
        if self.module.state_dict():
            broadcast_parameters(self.module.state_dict(), root_rank=0)
        if _core.size() > 1:
            self._register_hooks()

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Gradients of the backward passes inside accumulate locally; the
        first backward after it push_pulls their sum."""
        old = self._require_backward_grad_sync
        self._require_backward_grad_sync = False
        try:
            yield
        finally:
            self._require_backward_grad_sync = old

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        if self.broadcast_buffers and any(True for _ in self.module.buffers()):
            with torch.no_grad():
                broadcast_parameters(list(self.module.named_buffers()), root_rank=0)
        return self.module(*inputs, **kwargs)

    def _register_hooks(self) -> None:
        for p in self._params:
            acc = p.expand_as(p).grad_fn.next_functions[0][0]
            acc.register_hook(self._make_hook(p))
            self._grad_accs.append(acc)

    def _make_hook(self, p: torch.nn.Parameter) -> Any:
        def hook(*_: Any) -> None:
            if not self._require_backward_grad_sync:
                return
            self._start(p)
            if len(self._handles) == len(self._params):
                self.synchronize()
        return hook

    def _start(self, p: torch.nn.Parameter) -> None:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        sent, ctx = self._compression.compress(p.grad)
        handle = push_pull_async_inplace(sent, average=True,
                                         name="Gradient." + self._names[id(p)],
                                         priority=self._priority[id(p)])
        self._handles[id(p)] = (p, handle, ctx, sent)

    def synchronize(self) -> None:
        """Push_pulls every gradient no hook started since the last call
        (a parameter the forward pass skipped), then waits for them all
        and writes the averages into the ``.grad``s."""
        if _core.size() == 1:
            return
        for p in self._params:
            if id(p) not in self._handles:
                self._start(p)
        handles, self._handles = self._handles, {}
        for p, handle, ctx, _ in handles.values():
            out = self._compression.decompress(synchronize(handle), ctx)
            if out.data_ptr() != p.grad.data_ptr():
                p.grad.copy_(out)
