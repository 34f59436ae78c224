"""DistributedOptimizer's sync modes as strategy objects.

A DistributedOptimizer holds one mode (``opt._sync``) and hands it step(),
synchronize(), global_average() and the job's re-forming (reset):

* LockStep ("sync"): the gradients are summed as backward produces them
  (the optimizer's hooks, optimizer.py), and step() waits for the sums
  before the wrapped optimizer's update.
* ServerHeld ("async", "ssp:S"): the servers hold the parameters; each
  step() sends the change the wrapped optimizer made and loads the
  servers' values as they stand.
* GroupAverage ("dssync:G"): each step() averages the parameters within
  the step's group, overlapped with the next step's compute by default.

ServerHeld and GroupAverage exchange parameters rather than gradients,
through the same machinery (_Exchanging): a push_pull of each parameter
on a tensor named after the mode, started together and landed in order.
A mode reaches its optimizer only through what every mode needs: the
parameter groups, their names and priorities, and the wrapped
optimizer's own step (``opt._base_step``).
"""

from __future__ import annotations

import ctypes
import os
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Tuple

import torch

from unisum import _capi
from unisum.torch._core import _flying, _optimizers, _raise_kept, _starting, _wait
from unisum.torch.ops import _declared, push_pull_async, synchronize

if TYPE_CHECKING:
    from unisum.torch.optimizer import _DistributedOptimizer

_Closure = Optional[Callable[[], float]]


class _Mode:
    """What every sync mode answers; the defaults do nothing."""

    # Whether the optimizer hooks the gradients (lock-step only).
    sums_gradients = False

    def __init__(self, opt: "_DistributedOptimizer", spec: str) -> None:
        self.opt = opt
        self.spec = spec    # "sync", "async", "ssp:S" or "dssync:G"

    def step(self, closure: _Closure) -> Optional[float]:
        raise NotImplementedError

    def synchronize(self) -> None:
        """optimizer.synchronize(): nothing unless the mode sums gradients
        or has an exchange in flight."""

    def global_average(self) -> None:
        """optimizer.global_average(): only GroupAverage has one."""

    def reset(self) -> None:
        """The job re-formed (rejoin): what was in flight is gone."""


class LockStep(_Mode):
    """"sync": the optimizer's gradient hooks start each sum as backward
    produces the gradient; step() waits for them, unless inside
    skip_synchronize(), then updates."""

    sums_gradients = True

    def step(self, closure: _Closure) -> Optional[float]:
        return self.opt._lock_step(closure)

    def synchronize(self) -> None:
        self.opt._synchronize_gradients()


def _all_params(opt: "_DistributedOptimizer") -> List[torch.Tensor]:
    return [p for group in opt.param_groups for p in group["params"]]


class _Exchanging(_Mode):
    """The exchanges of parameters of ServerHeld and GroupAverage: each
    in flight is (parameter, pushed, result, handle, the parameter's
    version when it started), landed in the order they started."""

    def __init__(self, opt: "_DistributedOptimizer", spec: str) -> None:
        super().__init__(opt, spec)
        self.inflight: List[Tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int]] = []

    def reset(self) -> None:
        self.inflight = []      # unisum_rejoin() ended them; their buffers may go
        _flying.discard(self)

    def loaded(self, p: torch.Tensor, out: torch.Tensor) -> None:
        """p was just loaded from `out`, its exchange's result."""

    def exchange(self, items: List[Tuple[torch.Tensor, torch.Tensor]], flags: int) -> None:
        """push_pull of each (parameter, what to push) at once; loads each
        result into its parameter."""
        self._exchange_start(items, flags, copy=False)
        self._exchange_end()

    def _exchange_start(self, items: List[Tuple[torch.Tensor, torch.Tensor]], flags: int,
                        copy: bool) -> None:
        """Starts exchange()'s push_pulls, each recorded as soon as it
        started.  `copy` pushes a copy, for a push that stays in flight
        while the caller goes on with the parameters.  What an
        interrupted wait left in flight ends first."""
        self._exchange_end()
        _flying.add(self)   # _exchange_end drops it once nothing is in flight
        for p, push in items:
            if p.is_cuda:
                raise TypeError("unisum.torch: DistributedOptimizer(sync=%r) keeps parameters on "
                                "the servers and takes CPU parameters only, for now; "
                                "lock-step (sync='sync') takes CUDA ones" % self.spec)
            name = self.spec.split(":")[0] + "." + self.opt._names[id(p)]
            tid = _declared(name, p.dtype, p.numel(), self.opt._priority.get(id(p), 0),
                            sync=self.spec)
            src = push.detach().clone(memory_format=torch.contiguous_format) if copy \
                else push.detach().contiguous()
            out = torch.empty_like(src)
            h = ctypes.c_int64(0)
            with _starting(h):
                _capi.check(_capi.lib.unisum_push_pull_async(tid, src.data_ptr(), out.data_ptr(),
                                                             flags, ctypes.byref(h)),
                            "unisum.torch: push_pull of '%s'" % name)
            self.inflight.append((p, src, out, h.value, p._version))
            _raise_kept()

    def _exchange_end(self) -> None:
        """Waits for each exchange in flight, in the order they started,
        and loads its result into its parameter, unless the parameter was
        written since the push started (load_state_dict, a broadcast): the
        caller's values win.  An interrupted wait (Ctrl-C) leaves the rest
        in flight, and held, for the next call.  (_core's _land_flying
        calls it by this name, as it calls CrossBarrier's.)"""
        errors = []
        try:
            while self.inflight:
                p, _src, out, handle, version = self.inflight[0]
                rc = _wait(handle)
                self.inflight.pop(0)
                if rc != 0:
                    errors.append(rc)
                elif p._version == version:
                    with torch.no_grad():
                        p.data.copy_(out.view_as(p))
                    self.loaded(p, out)
        finally:
            if not self.inflight:
                _flying.discard(self)
        if errors:
            _capi.check(errors[0], "unisum.torch: push_pull (sync=%s)" % self.spec)


class ServerHeld(_Exchanging):
    """"async" and "ssp:S": the servers hold the parameters.  The first
    push of each, at construction, makes rank 0's values the servers'
    (the others' are dropped), and every worker loads them."""

    def __init__(self, opt: "_DistributedOptimizer", spec: str) -> None:
        super().__init__(opt, spec)
        # Each parameter as this worker last had it from the servers; a
        # step sends the change since.
        self.old: Dict[torch.Tensor, torch.Tensor] = {}
        self.exchange([(p, p.data) for p in _all_params(opt)], 0)

    def loaded(self, p: torch.Tensor, out: torch.Tensor) -> None:
        self.old[p] = out.view_as(p).clone()

    def step(self, closure: _Closure) -> Optional[float]:
        """The wrapped optimizer's step on this worker's own gradients,
        then the change it made goes to the servers as a delta (added at
        once, no worker waiting for another; under SSP the servers hold a
        worker too far ahead), and the parameters become the servers'
        values as they stand."""
        loss = self.opt._base_step(closure)
        self.exchange([(p, p.data - self.old[p]) for p in _all_params(self.opt)], 0)
        return loss


class GroupAverage(_Exchanging):
    """"dssync:G": parameters averaged within each step's group (the C
    library picks the group from the step and the job)."""

    def __init__(self, opt: "_DistributedOptimizer", spec: str) -> None:
        super().__init__(opt, spec)
        # UNISUM_DSSYNC_OVERLAP (unisum_init checked it): an overlapped
        # step leaves its group average in flight for the next step().
        self.overlap = int(os.environ.get("UNISUM_DSSYNC_OVERLAP", "1") or "1") != 0
        _optimizers.add(opt)    # rejoin() forgets its exchange in flight

    def synchronize(self) -> None:
        self._exchange_end()    # the group average in flight, if any, loaded

    def step(self, closure: _Closure) -> Optional[float]:
        """The wrapped optimizer's step on this worker's own gradients, then
        each parameter becomes the average over this step's group (as in
        DS-Sync, parameters rather than gradients: the groups drift apart
        between global steps, and averaging what they hold is what pulls
        them together), or over every worker on a global step.

        Overlapped (the default): the average of what the parameters held
        when the last step() ended was summed while this step's forward
        and backward ran on those same values; it is loaded now and this
        step's update applied on top, and the new values' average starts
        and is left in flight (D-PSGD's x' = W x - lr g(x), where the
        sketch's form is W (x - lr g(x))).  The communication then hides
        behind the next step's compute, as lock-step's gradient sums hide
        behind backward.  With a closure the average is loaded before the
        closure runs: its gradient is taken at the average, and nothing
        overlaps."""
        self._exchange_end()
        loss = self.opt._base_step(closure)
        self._exchange_start([(p, p.data) for p in _all_params(self.opt)], _capi.AVERAGE,
                             copy=self.overlap)
        if not self.overlap:
            self._exchange_end()
        return loss

    def global_average(self) -> None:
        """Every parameter averaged over all workers now (DS-Sync's global
        step): every replica is then the same, bit for bit."""
        self._exchange_end()
        names = self.opt._names
        handles = [(p, push_pull_async(p.data, average=True, name="dssync.global." + names[id(p)]))
                   for p in _all_params(self.opt)]
        for p, h in handles:
            out = synchronize(h)
            with torch.no_grad():
                p.data.copy_(out.view_as(p))


def mode_of(opt: "_DistributedOptimizer", spec: str) -> _Mode:
    """The strategy of sync mode `spec` (checked already: ops._sync_mode)."""
    if spec == "sync":
        return LockStep(opt, spec)
    if spec.startswith("dssync:"):
        return GroupAverage(opt, spec)
    return ServerHeld(opt, spec)


