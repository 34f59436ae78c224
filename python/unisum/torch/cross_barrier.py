"""BytePS's ``byteps.torch.cross_barrier``: an optimizer whose updates
cross the barrier between one step and the next (ByteScheduler, SOSP
2019).

    import unisum.torch.cross_barrier as bps

    bps.init()
    optimizer = bps.CrossBarrier(model, optimizer,
                                 named_parameters=model.named_parameters(),
                                 num_steps=steps)
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    bps.broadcast_optimizer_state(optimizer, root_rank=0)
    for batch in data:
        optimizer.zero_grad()
        loss_fn(model(batch)).backward()
        optimizer.step()        # returns without waiting for the sums

step() does not wait for the gradients' sums.  Each parameter is updated
as late as it can be: just before the forward pass of the module that
holds it, so the sums of the last layers' gradients travel while the
first layers compute.  A parameter that no leaf module holds (one of a
module with children of its own) is updated at step().  The module gives
every name of ``unisum.torch`` too, as BytePS's gives its own.

The choice, named: BytePS updates each parameter from a poller thread as
its sum lands, and reimplements SGD, Adam and RMSprop for one parameter
at a time.  Here the update runs on the training thread, in the module's
forward pre-hook, and it is the wrapped optimizer's own step over that one
parameter (DistributedOptimizer's _update_only): any optimizer whose
update of a parameter depends on that parameter alone works, and the
parameters end as DistributedOptimizer's would, bit for bit.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import torch

from unisum.torch import *  # noqa: F401, F403 (BytePS's module gives every name
from unisum.torch._core import _flying, _require_init
from unisum.torch.compression import Compression, Compressor
from unisum.torch.optimizer import DistributedOptimizer


class _CrossBarrier(torch.optim.Optimizer):
    """What CrossBarrier() returns: the DistributedOptimizer it wraps, with
    step() leaving the updates to each module's forward pre-hook.  Every
    attribute it does not define is the wrapped optimizer's."""

    def __init__(self, model: torch.nn.Module, opt: Any, num_steps: int) -> None:
        # torch.optim.Optimizer's constructor is not run: the state and
        # the parameter groups are the wrapped optimizer's (properties).
        self._opt = opt
        self._steps = 0
        self._final_step = num_steps
        # parameter -> (the handle of its gradient's sum, compress()'s
        # context): summed, or being summed, and not yet applied.
        self._waiting: Dict[torch.Tensor, Tuple[Any, Any]] = {}
        covered = set()
        self._hooks: List[Any] = []
        for mod in model.modules():
            own = list(mod.parameters(recurse=False))
            if own and next(mod.children(), None) is None:
                covered.update(own)
                self._hooks.append(mod.register_forward_pre_hook(self._before_forward))
        # Parameters no leaf module holds: updated at step().
        self._at_step = [p for g in opt.param_groups for p in g["params"] if p not in covered]
        # A parameter used outside its module's forward (tied weights used
        # through another) gets its gradient while its update still
        # waits: the update goes first, so the sum in flight, which lands
        # in its .grad, is not mixed with the next gradient.
        for g in opt.param_groups:
            for p in g["params"]:
                if p.requires_grad:
                    self._hooks.append(p.register_hook(self._before_gradient(p)))

    param_groups = property(lambda self: self._opt.param_groups)
    state = property(lambda self: self._opt.state)
    defaults = property(lambda self: self._opt.defaults)

    # broadcast_optimizer_state's: the optimizer whose state is broadcast
    # (and whose step makes that state, when it has none yet).
    _unisum_wrapped = property(lambda self: self._opt)

    def __getattr__(self, name: str) -> Any:
        opt = self.__dict__.get("_opt")
        if opt is None:
            raise AttributeError(name)
        return getattr(opt, name)

    def __repr__(self) -> str:
        return "CrossBarrier(%r)" % (self._opt,)

    def _before_forward(self, module: torch.nn.Module, inputs: Any) -> None:
        """The forward pre-hook of each leaf module: its parameters' updates
        land first."""
        for p in module.parameters(recurse=False):
            if p in self._waiting:
                self._apply(p)

    def _before_gradient(self, p: torch.Tensor) -> Callable[[torch.Tensor], None]:
        """The hook that sees p's gradient before autograd adds it to
        p.grad: p's waiting update, if any, is applied first."""
        def hook(grad: torch.Tensor) -> None:
            if p in self._waiting:
                self._apply(p)
        return hook

    def _apply(self, p: torch.Tensor) -> None:
        """Waits for the sum of p's gradient, updates p with it, and zeroes
        the gradient for the next step."""
        handle, ctx = self._waiting.pop(p)
        if not self._waiting:
            _flying.discard(self)
        self._opt._land(p, handle, ctx)
        self._opt._update_only(p)
        with torch.no_grad():
            p.grad.zero_()

    def _exchange_end(self) -> None:
        """Applies every update still waiting (unisum.torch ends every
        optimizer's exchange in flight before a broadcast, shutdown and at
        exit)."""
        while self._waiting:
            self._apply(next(iter(self._waiting)))

    def synchronize(self) -> None:
        """Applies every update still waiting: the parameters are then as a
        DistributedOptimizer's step() leaves them (before reading them
        outside a forward pass: to save or evaluate them)."""
        self._exchange_end()

    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        """Starts the sums of the gradients whose hooks have not (parameters
        unused here contribute zeros), and returns without waiting for
        them: each lands in its module's next forward pass.  At the
        num_steps-th step every update lands before it returns.

        Args:
            closure: Run first, its value returned (as BytePS does).

        Raises:
            UnisumError: When a gradient's sum fails.
        """
        loss = closure() if closure is not None else None
        opt = self._opt
        # A parameter this step's forward did not reach here (a skipped
        # layer) still waits for the last step's update: applied before
        # its zeros are summed.
        for p in [p for p in self._waiting if p not in opt._handles]:
            self._apply(p)
        opt._start_missing()
        for p, (handle, ctx, _) in opt._handles.items():
            self._waiting[p] = (handle, ctx)
        opt._handles.clear()
        if self._waiting:
            _flying.add(self)
        for p in self._at_step:
            if p in self._waiting:
                self._apply(p)
        self._steps += 1
        if self._steps >= self._final_step:
            self._exchange_end()
        return loss

    def zero_grad(self, set_to_none: Optional[bool] = None) -> None:
        """Zeroes the gradients that wait for no update (a waiting one is
        zeroed once its update is applied).  set_to_none is taken and
        ignored: the gradients keep their homes (the shared arena)."""
        del set_to_none
        with torch.no_grad():
            for group in self._opt.param_groups:
                for p in group["params"]:
                    if p.grad is not None and p not in self._waiting:
                        p.grad.zero_()

    def state_dict(self) -> Dict[str, Any]:
        """The wrapped optimizer's, once every waiting update is applied."""
        self._exchange_end()
        return self._opt.state_dict()

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Into the wrapped optimizer, once every waiting update is applied."""
        self._exchange_end()
        self._opt.load_state_dict(state_dict)


def CrossBarrier(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 named_parameters: Optional[Iterable[Tuple[str, torch.Tensor]]] = None,
                 compression: Compressor = Compression.none,
                 backward_passes_per_step: int = 1, num_steps: int = 10 ** 6) -> Any:
    """BytePS's CrossBarrier: DistributedOptimizer(optimizer, ...) whose
    step() returns without waiting, each parameter being updated just
    before its module's next forward pass (see the module docstring).

    Args:
        model: The model whose modules get the forward pre-hooks.
        optimizer: The torch.optim.Optimizer to wrap (lock-step only).
        named_parameters, compression, backward_passes_per_step: As for
            DistributedOptimizer.
        num_steps: The number of training steps: the last one applies
            every update before it returns.

    Raises:
        UnisumError: When init() has not been called.
        ValueError: As DistributedOptimizer.
    """
    _require_init()
    opt = DistributedOptimizer(optimizer, named_parameters=named_parameters,
                               compression=compression,
                               backward_passes_per_step=backward_passes_per_step)
    return _CrossBarrier(model, opt, num_steps)
