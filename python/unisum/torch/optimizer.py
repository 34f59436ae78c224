"""DistributedOptimizer (horovod.torch's and byteps.torch's): gradients
summed over the workers as backward produces them, or the parameters kept
on the servers (async, SSP) or averaged within groups (dssync).

Sync modes (DistributedOptimizer's ``sync``; each is a strategy object of
_sync_modes.py, which the optimizer hands step() and synchronize()):

* "sync": lock-step; the gradients are averaged.
* "async": BytePS's asynchronous training: each step() runs the wrapped
  optimizer on this worker's own gradients and sends the change it made,
  new - old, to the servers, which add it at once and hold the
  parameters; the parameters then become the servers' values as they
  stand, no worker waiting for another.  The first values are rank 0's,
  taken at construction.
* "ssp:S": async with bounded staleness: a step() returns only once no
  worker is more than S steps behind this one; S=0 is lock-step.
* "dssync:G": divide and shuffle: each step() runs the wrapped optimizer
  on this worker's own gradients and then averages the parameters within
  a group of G workers, another every step, derived from the step and the
  job, and every UNISUM_DSSYNC_GLOBAL_EVERY-th step over all workers;
  global_average() averages over all now.  With UNISUM_DSSYNC_OVERLAP=1,
  the default, a step's average runs during the next step's forward and
  backward, which the next step() loads before its update: D-PSGD's form.

Compression (``compression_params``): BytePS's gradient compression, done
by the C library: the machine's root compresses each partition of the
machine's float32 gradient sum, the servers decompress, sum, compress the
sum once, and every worker decompresses it.  A dict with BytePS's keys:
"compressor" ("onebit", "topk", "randomk", "dithering", "fp16", "bf16"),
"ef" ("vanilla", or "sparse" for randomk: error feedback), "momentum"
("nesterov", applied before compressing: give the wrapped optimizer no
momentum of its own) and "momentum_mu", "scaling" (onebit), "k" (topk,
randomk: a count, or a fraction below 1), "seed", "s", "normalize" and
"partition" (dithering), e.g. ``{"compressor": "onebit", "ef":
"vanilla", "momentum": "nesterov"}``.  Gradients below
UNISUM_MIN_COMPRESS_BYTES (64 KiB) and of other dtypes go uncompressed.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import (Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple, TypeVar,
                    cast)

import torch

from unisum import _capi
from unisum._capi import UnisumError
from unisum.torch.compression import Compression, Compressor
from unisum.torch._core import (_DTYPES, _land_flying, _lock, _optimizers, _require_init, _tensors,
                                local_size, rank, size)
from unisum.torch._memory import zeros_like
from unisum.torch._sync_modes import mode_of
from unisum._horovod.basics import Average, Sum
from unisum._horovod.gather import sparse_allreduce_async
from unisum.torch.ops import _in_set, _pset_of, _scaled, _shaped, _start, _sync_mode, synchronize

_optimizer_counter = 0        # DistributedOptimizers made so far


def _parameter_names(all_params: List[torch.Tensor],
                     named_parameters: Optional[Iterable[Tuple[str, torch.Tensor]]]
                     ) -> Tuple[Dict[int, str], Dict[int, int]]:
    """Each parameter's name (by id) and place among the optimizer's
    parameters: from named_parameters, or by their place (the optimizer's
    too, see DistributedOptimizer).

    Raises:
        ValueError: For a name twice, or a parameter missing from
            named_parameters.
    """
    if named_parameters is not None:
        named = list(named_parameters)
        names = [n for n, _ in named]
        if len(set(names)) != len(names):
            raise ValueError("unisum.torch: named_parameters holds duplicate names")
        by_id = {id(p): n for n, p in named}
        missing = [p for p in all_params if id(p) not in by_id]
        if missing:
            raise ValueError("unisum.torch: %d optimizer parameters are missing from "
                             "named_parameters" % len(missing))
        order = {id(p): i for i, (_, p) in enumerate(named)}
    else:
        # Unnamed: number the optimizers too (they are made in the same
        # order on every worker) so two of them never share names.
        global _optimizer_counter
        with _lock:
            _optimizer_counter += 1
            prefix = "optimizer%d.param." % _optimizer_counter
        by_id = {id(p): prefix + str(i) for i, p in enumerate(all_params)}
        order = {id(p): i for i, p in enumerate(all_params)}
    return by_id, order


class _DistributedOptimizer(torch.optim.Optimizer):
    """Mixed into the user's optimizer class by DistributedOptimizer()."""

    _unisum_class: Any      # the class DistributedOptimizer() made (set there)

    def __init__(self, params: Iterable[Dict[str, Any]],
                 named_parameters: Optional[Iterable[Tuple[str, torch.Tensor]]],
                 compression: Compressor, backward_passes_per_step: int,
                 shared_gradients: bool = True, reduce: Optional[Dict[str, Any]] = None) -> None:
        # self._unisum_class is the class DistributedOptimizer() made, whose
        # base is the user's optimizer class: its constructor has defaults
        # for everything but the parameters, which torch.optim.Optimizer's
        # has not.
        super(self._unisum_class, self).__init__(params)  # type: ignore[call-arg]
        # An earlier optimizer's exchange in flight, perhaps on these same
        # parameters' tensors: it lands first.
        _land_flying()
        self._compression = compression
        self._passes = backward_passes_per_step
        # How gradients are reduced (DistributedOptimizer's op,
        # gradient_predivide_factor, sparse_as_dense, process_set).
        reduce = reduce or {}
        self._sum = bool(reduce.get("sum", False))
        self._predivide = float(reduce.get("predivide", 1.0))
        self._sparse_as_dense = bool(reduce.get("sparse_as_dense", False))
        self._process_set = reduce.get("process_set")   # Horovod's object, or None
        # Parameters seen with a sparse gradient, and its sparse_dim.
        self._sparse: Dict[torch.Tensor, int] = {}
        self._spec: Optional[str] = reduce.get("compression")
        self._pset = int(reduce.get("pset", 0))
        self._members = int(reduce.get("members", size()))
        self._included = bool(reduce.get("included", True))
        all_params = [p for group in self.param_groups for p in group["params"]]
        by_id, order = _parameter_names(all_params, named_parameters)
        self._names: Dict[int, str] = by_id
        # Horovod's name for the same map, parameter -> name.
        self._parameter_names: Dict[torch.Tensor, str] = {p: by_id[id(p)] for p in all_params}
        # The first parameters (first layers) are needed first in the next
        # forward pass: higher priority.
        self._priority: Dict[int, int] = {pid: len(order) - i for pid, i in order.items()}
        # parameter -> (handle or None before the last pass, compress()'s
        # context, the tensor being summed)
        self._handles: Dict[torch.Tensor, Tuple[Optional[int], Any, Optional[torch.Tensor]]] = {}
        self._synchronized = False      # synchronize() ran since the last step()
        self._should_synchronize = True  # False inside skip_synchronize()
        self._delay: Dict[torch.Tensor, int] = {}
        self._grad_accs: List[Any] = []
        # How the workers' parameters stay together: a strategy object of
        # _sync_modes (lock-step, server-held or group-averaged).
        self._sync = mode_of(self, str(reduce.get("sync", "sync")))
        if not self._sync.sums_gradients:
            return
        self._register_hooks()
        # Parameters whose home in the shared arena waits for its first
        # gradient's check (_share_gradients), and the check's hook.
        self._home_checks: Dict[torch.Tensor, Any] = {}
        if shared_gradients and local_size() > 1:
            self._share_gradients()
        _optimizers.add(self)

    def _unisum_reset(self) -> None:
        """The job re-formed (rejoin): what was in flight is gone, and an
        average is over the new number of workers."""
        self._handles.clear()
        self._sync.reset()
        self._synchronized = False
        for p in self._delay:
            self._delay[p] = self._passes
        if self._pset == 0:
            self._members = size()

    def _base_step(self, closure: Optional[Callable[[], float]]) -> Optional[float]:
        """The wrapped optimizer's own step (for the sync modes)."""
        return super(self._unisum_class, self).step(closure)

    def global_average(self) -> None:
        """Averages every parameter over all workers now (DS-Sync's global
        step, e.g. at the end of training): every replica is then the
        same, bit for bit.  Lock-step and async optimizers have nothing to
        do."""
        self._sync.global_average()

    def _share_gradients(self) -> None:
        """Gives every gradient that does not exist yet a zeroed home in the
        shared arena; backward then accumulates into it in place.

        Only a dense gradient of the parameter's shape may live there, and
        which kind a parameter gets shows only in backward (the weight of
        nn.Embedding(sparse=True) gets a sparse one).  So a hook on each
        homed parameter looks at its first gradient as it arrives, before
        autograd adds it to ``.grad``: a gradient of another kind makes the
        parameter give its home up, and autograd then keeps that gradient
        as it came, as it would have without the arena."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad and p.grad is None and p.device.type == "cpu" and \
                        p.dtype in _DTYPES and p.numel() > 0:
                    p.grad = zeros_like(p)
                    self._home_checks[p] = p.register_hook(self._home_check(p))

    def _home_check(self, p: torch.Tensor) -> Callable[[torch.Tensor], None]:
        """The hook of _share_gradients on p, which runs once: on p's first
        gradient, as it arrives."""
        home = cast(torch.Tensor, p.grad).data_ptr()

        def check(grad: torch.Tensor) -> None:
            if grad.layout != torch.strided or grad.shape != p.shape or grad.dtype != p.dtype:
                if p.grad is not None and p.grad.data_ptr() == home:
                    p.grad = None       # still the untouched home: autograd stores grad as is
            self._home_checks.pop(p).remove()
        return check

    def _register_hooks(self) -> None:
        """Hooks every parameter that requires a gradient: its gradient is
        pushed when backward() has produced it for the last time before the
        next step().  PyTorch 2.1 and later say so themselves
        (register_post_accumulate_grad_hook); before, the hook goes on the
        parameter's gradient accumulator, which runs at the same moment."""
        for group in self.param_groups:
            for p in group["params"]:
                if not p.requires_grad:
                    continue
                self._delay[p] = self._passes
                if hasattr(p, "register_post_accumulate_grad_hook"):
                    self._grad_accs.append(p.register_post_accumulate_grad_hook(
                        self._make_hook(p)))
                    continue
                p_tmp = p.expand_as(p)
                grad_acc = p_tmp.grad_fn.next_functions[0][0]
                grad_acc.register_hook(self._make_hook(p))
                self._grad_accs.append(grad_acc)

    def _grad_name(self, p: torch.Tensor, tensor: torch.Tensor) -> str:
        """"gradient." and the parameter's name: a worker whose parameter
        differs in shape or dtype then fails at the declaration, with every
        other worker, instead of waiting for a name nobody else uses.  Only
        when this process already sums another gradient of that name with
        another shape (a second model with a parameter of the same name)
        does the shape join the name, the same way on every worker."""
        name = "gradient." + self._names[id(p)]
        with _lock:
            known = _tensors.get(_in_set(self._pset, name))
        if known is not None and (known[1], known[2]) != (tensor.dtype, tensor.numel()):
            name = _shaped(name, tensor)
        return name

    def _push_pull_grad(self, p: torch.Tensor) -> Tuple[Any, Any, Optional[torch.Tensor]]:
        """Starts summing p's gradient in place (compressed); returns the
        handle, compress()'s context and the tensor being summed.  A
        sparse gradient goes as Horovod's does: with sparse_as_dense, made
        dense and summed (synchronize() makes the sum sparse again);
        without, every worker's indices and values are allgathered, and
        the handle is a function that waits for them and gives the sparse
        sum (no compression, no predivision: Horovod's sparse path has
        neither)."""
        grad = cast(torch.Tensor, p.grad)
        if grad.is_sparse:
            self._sparse.setdefault(p, grad.sparse_dim())
            if not self._sparse_as_dense:
                return sparse_allreduce_async(
                    grad, "gradient." + self._names[id(p)], Sum if self._sum else Average,
                    self._process_set), None, None
            grad = grad.to_dense()
        compressed, ctx = self._compression.compress(grad)
        flags, scale = (0 if self._sum else _capi.AVERAGE), 1.0
        if self._predivide != 1.0:
            # Horovod's gradient_predivide_factor f: divided by f before the
            # sum, by size / f after it.
            compressed.copy_(_scaled(compressed, 1.0 / self._predivide))
            flags, scale = 0, self._predivide / self._members
        spec = self._spec if compressed.dtype == torch.float32 else None
        # average=False: `flags` says whether the sum is averaged (it
        # overrides `average`), and scale divides what predivision left.
        handle = _start(compressed, False, self._grad_name(p, compressed),
                        self._priority[id(p)], True, scale=scale, flags=flags, pset=self._pset,
                        compression=spec)
        return handle, ctx, compressed

    def _make_hook(self, p: torch.Tensor) -> Callable[..., None]:
        """The hook of p's gradient accumulator (see _register_hooks)."""
        def hook(*ignore: Any) -> None:
            if not self._included:
                return      # not in the optimizer's process set: nothing is summed
            if self._delay[p] <= 0:
                raise UnisumError(
                    "unisum.torch: gradients of '%s' were computed more than "
                    "backward_passes_per_step=%d times before step(); call step() or "
                    "synchronize() in between" % (self._names[id(p)], self._passes))
            self._delay[p] -= 1
            if self._delay[p] == 0:
                self._handles[p] = self._push_pull_grad(p)
            else:
                self._handles[p] = (None, None, None)
        return hook

    def synchronize(self) -> None:
        """Waits for every gradient's sum.  A parameter whose hook did not
        fire on this worker (unused in this step's graph here, perhaps used
        on others) contributes zeros, as in Horovod, so no worker waits
        forever for it.

        Each parameter's ``.grad`` then holds the average over the workers.
        Call it before reading or changing the gradients (to clip them, say),
        and then step() inside skip_synchronize().

        Raises:
            UnisumError: When a gradient's sum fails, or a gradient's name,
                dtype or size differs between the workers.
        """
        self._sync.synchronize()

    def _synchronize_gradients(self) -> None:
        """synchronize() of lock-step (the sync mode's)."""
        self._start_missing()
        for p, (handle, ctx, _) in self._handles.items():
            self._land(p, handle, ctx)
        self._handles.clear()
        self._synchronized = True

    def _start_missing(self) -> None:
        """Starts the sum of every gradient whose hook has not started it:
        a parameter unused in this step's graph here (perhaps used on
        others) contributes zeros, as in Horovod, so no worker waits
        forever for it."""
        for group in self.param_groups:
            for p in group["params"]:
                if self._included and p.requires_grad and \
                        (p not in self._handles or self._handles[p][0] is None):
                    if p in self._sparse and (p.grad is None or p.grad._nnz() == 0):
                        # Unused here: an empty sparse gradient shaped like
                        # the others' (zero_grad leaves a sparse one with
                        # every dimension sparse).
                        sd = self._sparse[p]
                        p.grad = torch.sparse_coo_tensor(
                            torch.empty((sd, 0), dtype=torch.int64),
                            torch.empty((0,) + tuple(p.shape[sd:]), dtype=p.dtype), p.shape)
                    elif p.grad is None:
                        p.grad = torch.zeros_like(p)    # unused here: zeros
                    self._handles[p] = self._push_pull_grad(p)

    def _land(self, p: torch.Tensor, handle: Any, ctx: Any) -> None:
        """Waits for the sum of p's gradient that `handle` stands for
        (_push_pull_grad's, with compress()'s context `ctx`) and puts it in
        p.grad."""
        grad = cast(torch.Tensor, p.grad)
        if callable(handle):
            p.grad = handle()       # a sparse gradient's allgathered sum
        elif grad.is_sparse:
            out = self._compression.decompress(synchronize(handle), ctx)
            p.grad = out.reshape(grad.shape).to_sparse(grad.sparse_dim())
        else:
            out = self._compression.decompress(synchronize(handle), ctx)
            if out.data_ptr() != grad.data_ptr():
                grad.copy_(out.view_as(grad))
        self._delay[p] = self._passes

    def _update_only(self, p: torch.Tensor) -> None:
        """The wrapped optimizer's step for parameter p alone, on its
        gradient as it stands (CrossBarrier's update as each sum lands):
        the step sees one parameter group, p's own with p alone in it, so
        an optimizer whose update of a parameter depends on that
        parameter only (SGD, Adam, RMSprop, Adagrad, ...) updates it as a
        whole step would."""
        groups = self.param_groups
        group = next(g for g in groups if any(q is p for q in g["params"]))
        params = group["params"]
        group["params"] = [p]
        self.param_groups = [group]
        try:
            super(self._unisum_class, self).step()
        finally:
            group["params"] = params
            self.param_groups = groups

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """A context in which step() does not synchronize, because the
        caller did (Horovod's name and behaviour)::

            optimizer.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            with optimizer.skip_synchronize():
                optimizer.step()

        It raises nothing itself.
        """
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        """Waits for the sums of the gradients (synchronize()), unless inside
        skip_synchronize(), then updates the parameters as the wrapped
        optimizer does and returns what its step() returns.

        Warns (UserWarning) when synchronize() already ran since the last
        step() outside skip_synchronize(): the gradients are then summed
        again, which costs a whole round of communication.

        Args:
            closure: As for the wrapped optimizer's step(): a function that
                re-evaluates the model and returns the loss, or None.

        Raises:
            UnisumError: When a gradient's sum fails (see synchronize()).
        """
        return self._sync.step(closure)

    def _lock_step(self, closure: Optional[Callable[[], float]]) -> Optional[float]:
        """step() of lock-step (the sync mode's)."""
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn(
                    "unisum.torch: optimizer.step() called without "
                    "optimizer.skip_synchronize() context after optimizer.synchronize(): every "
                    "gradient is summed over the workers again, which costs a whole round of "
                    "communication. Use "
                    "`with optimizer.skip_synchronize(): optimizer.step()` after synchronize().")
            self.synchronize()
        self._synchronized = False
        return super(self._unisum_class, self).step(closure)

    def zero_grad(self, set_to_none: Optional[bool] = None) -> None:
        """Zeroes the gradients as the wrapped optimizer does.

        Args:
            set_to_none: Set each ``.grad`` to None instead of zeroing it;
                None: the wrapped optimizer's own default (False in
                PyTorch 1.x, True from 2.0).

        Raises:
            UnisumError: When gradients are being summed (after backward(),
                before step() or synchronize()): zeroing them then would
                discard them.
        """
        if self._handles:
            raise UnisumError("unisum.torch: zero_grad() between backward() and step() would "
                              "discard gradients being summed; call step() or synchronize() first")
        if set_to_none is None:
            return super(self._unisum_class, self).zero_grad()
        return super(self._unisum_class, self).zero_grad(set_to_none=set_to_none)


_OptimizerT = TypeVar("_OptimizerT", bound=torch.optim.Optimizer)


# BytePS's compression_params keys that the C spec takes (compress.h).
_COMPRESSION_KEYS = ("compressor", "ef", "momentum", "momentum_mu", "mu", "scaling", "k",
                     "seed", "s", "normalize", "partition")


def _compression_spec(params: Optional[Dict[str, Any]]) -> Optional[str]:
    """The C spec text of BytePS's compression_params (None: none)."""
    if not params:
        return None
    if "compressor" not in params:
        raise ValueError("unisum.torch: compression_params needs a 'compressor' (one of "
                         "onebit, topk, randomk, dithering, fp16, bf16)")
    words = []
    for key, value in params.items():
        if key not in _COMPRESSION_KEYS:
            raise ValueError("unisum.torch: compression_params has an unknown key %r (known: "
                             "%s)" % (key, ", ".join(_COMPRESSION_KEYS)))
        if isinstance(value, bool):
            value = int(value)
        words.append("%s=%s" % (key, value))
    words.sort(key=lambda w: not w.startswith("compressor="))
    return ",".join(words)


def _check_horovod_args(named_parameters: Optional[List[Tuple[str, torch.Tensor]]],
                        backward_passes_per_step: int, op: int,
                        gradient_predivide_factor: float, num_groups: int, groups: Any) -> None:
    """DistributedOptimizer's checks of Horovod's arguments (see there)."""
    if named_parameters is not None:
        names = [n for n, _ in named_parameters]
        if len(set(names)) != len(names):
            raise ValueError("unisum.torch: named_parameters holds duplicate names")
    if backward_passes_per_step < 1:
        raise ValueError("unisum.torch: backward_passes_per_step must be >= 1")
    if op == 2:
        raise NotImplementedError("unisum.torch: DistributedOptimizer(op=Adasum) is not "
                                  "implemented; use op=Average")
    if op not in (0, 1):
        raise ValueError("unisum.torch: DistributedOptimizer takes op=Average or op=Sum, got %r"
                         % (op,))
    if gradient_predivide_factor != 1.0 and op != 0:
        raise ValueError("unisum.torch: gradient_predivide_factor is for op=Average only")
    if groups is not None and not (isinstance(groups, int) and groups > 0 or
                                   isinstance(groups, list) and
                                   all(isinstance(g, list) for g in groups)):
        raise ValueError("unisum.torch: groups must be a positive int or a list of lists of "
                         "parameters, as in Horovod")
    if num_groups < 0:
        raise ValueError("unisum.torch: num_groups must be >= 0")


def _reduce_of(op: int, gradient_predivide_factor: float, sparse_as_dense: bool,
               process_set: Any, sync: Optional[str], compression: Compressor,
               compression_params: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """How DistributedOptimizer's gradients are reduced (see there), once
    the sync mode and the compression are checked against the rest; the
    dict _DistributedOptimizer takes."""
    mode = _sync_mode(sync)
    spec = _compression_spec(compression_params)
    if spec is not None and (compression is not Compression.none or process_set is not None):
        raise ValueError("unisum.torch: DistributedOptimizer takes compression_params without "
                         "compression= and without a process_set")
    if mode != "sync" and (process_set is not None or compression is not Compression.none or
                           spec is not None):
        raise ValueError("unisum.torch: DistributedOptimizer(sync=%r) takes neither a "
                         "process_set nor compression" % mode)
    _require_init()
    pset = _pset_of(process_set, member=False)
    ranks = getattr(process_set, "ranks", None) if pset != 0 else None
    reduce = {"sum": op == 1, "predivide": float(gradient_predivide_factor),
              "sparse_as_dense": sparse_as_dense, "pset": pset, "process_set": process_set,
              "members": len(ranks) if ranks else size(),
              "included": ranks is None or rank() in ranks, "sync": mode,
              "compression": spec}
    return reduce


def DistributedOptimizer(optimizer: _OptimizerT,
                         named_parameters: Optional[Iterable[Tuple[str, torch.Tensor]]] = None,
                         compression: Compressor = Compression.none,
                         backward_passes_per_step: int = 1,
                         op: int = 0, gradient_predivide_factor: float = 1.0,
                         num_groups: int = 0, groups: Any = None,
                         sparse_as_dense: bool = False, process_set: Any = None,
                         shared_gradients: bool = True, sync: Optional[str] = None,
                         compression_params: Optional[Dict[str, Any]] = None) -> _OptimizerT:
    """Wraps `optimizer` so that every gradient is summed over all workers
    (averaged) as soon as backward() produces it, and step() waits for the
    sums before updating.  With shared_gradients (and several workers on
    this machine) the gradients live in the shared arena (see empty()).

    Returns a new optimizer of a subclass of `optimizer`'s class, with the
    same parameter groups and state, to use instead; it also has
    synchronize() and skip_synchronize(), and its zero_grad() refuses to
    discard gradients being summed.

    Args:
        optimizer: The torch.optim.Optimizer to wrap.
        named_parameters: The model's named_parameters(): each gradient is
            summed under its parameter's name.  None names them by their
            place in the optimizer (and the optimizer by its place among
            the DistributedOptimizers made so far), the same on every worker.
        compression: How gradients travel: Compression.none, or
            Compression.fp16 to send float gradients as float16.
        backward_passes_per_step: How many backward passes each step()
            follows; their gradients are summed locally before the last one
            is pushed.
        op: Horovod's: Average (0, the default) or Sum (1) of the
            gradients; Adasum raises NotImplementedError.
        gradient_predivide_factor: Horovod's f (op Average only): each
            gradient is divided by f before the sum and the sum by size/f
            after it (the same average, another rounding).
        num_groups, groups: Horovod's fusion groups: checked, unused (the
            PUSH stage already batches by priority under a credit).
        sparse_as_dense: A sparse gradient (nn.Embedding(sparse=True)'s)
            is made dense and summed, and the sum made sparse again; by
            default, as in Horovod, every worker's indices and values are
            allgathered instead (sparse_allreduce_async), which moves
            only the rows that changed.  Either way the gradient stays
            sparse, and out of the shared arena.
        process_set: A Horovod process set (add_process_set): gradients
            are averaged over its members only; on other ranks the
            optimizer sums nothing (as in Horovod).  None: every worker.
        shared_gradients: Put the gradients in the shared arena when several
            workers run on this machine; False keeps PyTorch's memory.
        sync: "sync" (lock-step, the default), "async", "ssp:S" or
            "dssync:G": see the module docstring.  None: UNISUM_SYNC, or
            BYTEPS_ENABLE_ASYNC=1, else "sync".
        compression_params: BytePS's gradient compression, done by the C
            library: see the module docstring.

    Raises:
        UnisumError: When init() has not been called.
        ValueError: For backward_passes_per_step below 1, a name twice in
            (or a parameter missing from) named_parameters, an unknown op
            or sync mode, gradient_predivide_factor with op Sum, sync
            other than "sync" with a process set or compression, and
            compression_params with compression, a process set or an
            unknown key.
        NotImplementedError: For op Adasum.
    """
    # The arguments first, as Horovod checks them: before init() too.
    if named_parameters is not None:
        named_parameters = list(named_parameters)
    _check_horovod_args(named_parameters, backward_passes_per_step, op,
                        gradient_predivide_factor, num_groups, groups)
    reduce = _reduce_of(op, gradient_predivide_factor, sparse_as_dense, process_set, sync,
                        compression, compression_params)
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    # The wrapper's methods call the wrapped class's through this class,
    # not self.__class__, which a subclass of it would make recurse.
    cls._unisum_class = cls
    wrapped = cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
                  shared_gradients, reduce)
    wrapped.load_state_dict(optimizer.state_dict())
    return wrapped
