"""Broadcasting parameters, objects and optimizer state from one rank to
every worker (horovod.torch.functions' names).
"""

from __future__ import annotations

import ctypes
import pickle
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

import numpy
import torch

from unisum import _capi
from unisum.torch._core import (_DTYPES, _Op, _land_flying, _lock, _ops, _raise_kept, _register,
                                _require_init, _starting, rank)
from unisum.torch.ops import _by_order, _in_set, _pset_of, _tensor_id, _undeclare, synchronize

def _broadcast_start(tensor: torch.Tensor, root_rank: int, name: Optional[str],
                     inplace: bool, one_shot: Optional[bool] = None, pset: int = 0) -> int:
    """Starts a broadcast of root's `tensor` into `tensor` itself (`inplace`)
    or a new tensor, and returns a handle for poll() / synchronize(), which
    returns the result.  `name` None names it by order; the name is
    undeclared after the call when it is `one_shot` (by default: when it was
    None).  Dtypes the C library does not sum (bool, uint8, int8, int16,
    complex) travel widened to int64 / float64, which carries them
    exactly.  `pset`: the process set it runs in (root_rank a member)."""
    _require_init()
    if not isinstance(tensor, torch.Tensor):
        raise TypeError("unisum.torch: broadcast takes a torch.Tensor, got %s" % type(tensor).__name__)
    if tensor.is_cuda:
        # Broadcasts set up training (parameters, optimizer state, objects):
        # through host memory, the host waiting for the copies.
        host = tensor.detach().to("cpu")
        h = _broadcast_start(host, root_rank, name, True, one_shot, pset)
        with _lock:
            op = _ops[h]
        first = op.finish

        def back() -> None:
            first()
            if op.failed:
                return
            if inplace:
                tensor.copy_(host)
            else:
                op.output = host.to(tensor.device)
        op.finish = back
        if inplace:
            op.output = tensor
        return h
    if one_shot is None:
        one_shot = name is None
    name = _in_set(pset, _by_order("broadcast", pset=pset) if name is None else name)
    src = tensor.detach()
    if src.dtype in _DTYPES:
        buf = src.contiguous() if inplace else src.clone(memory_format=torch.contiguous_format)
    elif src.dtype.is_complex:
        buf = torch.view_as_real(src.contiguous()).to(torch.float64)
    else:
        buf = src.to(torch.float64 if src.dtype.is_floating_point else torch.int64)
    # Where the result lands: the tensor itself, buf, or a new tensor.
    dest = src if inplace else buf if buf.dtype == src.dtype else torch.empty_like(src)
    output = tensor if inplace else dest

    def finish() -> None:
        if buf.data_ptr() != dest.data_ptr():
            dest.copy_(torch.view_as_complex(buf) if src.dtype.is_complex
                       else buf.reshape(dest.shape))
        if one_shot:
            _undeclare(name)

    # Declared even when empty: every worker's shape is checked.
    tid = _tensor_id(name, buf, 0)
    if buf.numel() == 0:
        finish()
        return _register(_Op(None, None, None, output, lambda: None), done=True)
    h = ctypes.c_int64(0)
    rc = 0
    with _starting(h):
        rc = _capi.lib.unisum_broadcast_async(tid, buf.data_ptr(), int(root_rank),
                                              ctypes.byref(h))
    if rc != 0 and one_shot:
        _undeclare(name)
    _capi.check(rc, "unisum.torch: broadcast")
    handle = _register(_Op(h.value, buf, buf, output, finish))
    _raise_kept()
    return handle


def _broadcast_(tensor: torch.Tensor, root_rank: int, name: str, pset: int = 0) -> None:
    """Overwrites `tensor` with root's tensor of the one-shot name `name`
    (_by_order).  Interrupted (KeyboardInterrupt), the broadcast stays in
    flight, its buffers kept by its handle."""
    synchronize(_broadcast_start(tensor, root_rank, name, inplace=True, one_shot=True, pset=pset))


def broadcast_parameters(params: Union[Dict[str, torch.Tensor],
                                       Iterable[Tuple[str, torch.Tensor]]],
                         root_rank: int) -> None:
    """Copies root's parameters to every worker, in place.  `params` is a
    state_dict() or named_parameters() (or any (name, tensor) pairs).

    The tensors travel in the order of their names, so every worker must
    pass the same names with tensors of the same shapes.  Tensors of any
    dtype and layout on the CPU work (dtypes unisum does not sum travel
    widened, exactly).  Every worker must make its calls of
    broadcast_parameters, broadcast_object and broadcast_optimizer_state,
    and its unnamed push_pulls, in the same order.

    Args:
        params: A dict of names to tensors (a state_dict()), or an iterable
            of (name, tensor) pairs (named_parameters()).
        root_rank: The rank whose tensors every worker receives.

    Raises:
        TypeError: When a value is not a torch.Tensor, or a tensor is not
            on the CPU.
        UnisumError: When init() has not been called, when the workers'
            tensors of a name differ in shape or dtype (``EMISMATCH``), or
            when a broadcast fails.
    """
    _require_init()
    _land_flying()      # a DS-Sync average in flight would land on top later
    items = params.items() if isinstance(params, dict) else params
    call = _by_order("broadcast_parameters")
    for name, p in sorted(items, key=lambda kv: kv[0]):
        if not isinstance(p, torch.Tensor):
            raise TypeError("unisum.torch: broadcast_parameters: '%s' is not a tensor" % name)
        _broadcast_(p, root_rank, "%s.%s" % (call, name))


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None,
                     process_set: Any = None) -> Any:
    """Returns root's `obj` on every worker (pickled; any size).

    The root gets its own `obj` back; every other worker gets an unpickled
    copy of it.  Every worker must make its calls of broadcast_object,
    broadcast_parameters and broadcast_optimizer_state, and its unnamed
    push_pulls, in the same order.

    Args:
        obj: On the root, any object that pickle can serialise; ignored on
            the other workers (None will do).
        root_rank: The rank whose `obj` every worker receives.
        name: A label added to the internal name of the call (which its
            place in the sequence of such calls fixes), the same on every
            worker; None for none.
        process_set: A Horovod process set (add_process_set) whose members
            alone take part, root_rank one of them; None for every worker.

    Raises:
        UnisumError: When init() has not been called, or when a broadcast
            fails (such as workers that disagree on `name`).
        pickle.PicklingError: On the root, when `obj` cannot be pickled
            (or whatever else pickle.dumps raises for it); the other workers
            raise what pickle.loads raises when they cannot unpickle it.
    """
    _require_init()
    pset = _pset_of(process_set)
    name = _by_order("broadcast_object", name, pset)
    is_root = rank() == root_rank
    if is_root:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        length = torch.tensor([len(data)], dtype=torch.int64)
    else:
        length = torch.zeros(1, dtype=torch.int64)
    _broadcast_(length, root_rank, name + ".len", pset)
    n = int(length.item())
    words = (n + 3) // 4
    if is_root:
        payload = torch.zeros(words, dtype=torch.int32)
        payload.numpy().view(numpy.uint8)[:n] = numpy.frombuffer(data, dtype=numpy.uint8)
    else:
        payload = torch.zeros(words, dtype=torch.int32)
    if words > 0:
        _broadcast_(payload, root_rank, name + ".data", pset)
    return obj if is_root else pickle.loads(payload.numpy().view(numpy.uint8)[:n].tobytes())


def _make_state(optimizer: torch.optim.Optimizer) -> None:
    """As Horovod: an optimizer that has not stepped yet gets its state
    made by one step on zero gradients, so that the state tensors exist
    to be broadcast.  The wrapped optimizer's own step: a
    DistributedOptimizer's would sum gradients, which only works when
    every rank steps.  The parameters stay as they are (Horovod lets
    weight decay move them here, away from the root's)."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad and p.grad is not None and not p.grad.is_sparse:
                p.grad.zero_()      # keeps a gradient's home (the shared arena)
            elif p.requires_grad:
                p.grad = p.data.new(p.size()).zero_()
                if isinstance(optimizer, torch.optim.SparseAdam):
                    p.grad = p.grad.to_sparse()
    kept = [p.detach().clone() for group in optimizer.param_groups for p in group["params"]]
    if "_unisum_class" in type(optimizer).__dict__:    # a DistributedOptimizer
        super(type(optimizer), optimizer).step()  # type: ignore[misc]
    else:
        optimizer.step()
    with torch.no_grad():
        for p, k in zip([p for group in optimizer.param_groups for p in group["params"]], kept):
            p.copy_(k)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int) -> None:
    """Makes every worker's optimizer state equal root's: the state tensors
    (momentum buffers, Adam moments, step counts) and the scalars of every
    parameter group (lr, momentum, ...).  Works for stateless optimizers.

    The other workers load root's state with optimizer.load_state_dict(); the
    root's optimizer is left as it is.  Every worker must make its calls of
    broadcast_optimizer_state, broadcast_parameters and broadcast_object,
    and its unnamed push_pulls, in the same order.

    Args:
        optimizer: This worker's optimizer (a DistributedOptimizer or any
            torch.optim.Optimizer) over the same parameters as on the other
            workers.
        root_rank: The rank whose state every worker receives.

    Raises:
        UnisumError: When init() has not been called, or when a broadcast
            fails (such as a state tensor whose shape differs between the
            workers).
        ValueError: When root's state does not fit this worker's optimizer
            (from optimizer.load_state_dict(), such as a different number of
            parameter groups).
    """
    _require_init()
    _land_flying()
    # A CrossBarrier: the DistributedOptimizer it wraps.
    optimizer = getattr(optimizer, "_unisum_wrapped", optimizer)
    if len(optimizer.state_dict()["state"]) == 0:
        _make_state(optimizer)
    state = optimizer.state_dict()
    # Root sends the layout (with tensors replaced by their shape and dtype);
    # then every tensor travels as a tensor.
    layout: Dict[Any, Dict[str, Tuple[Any, ...]]] = {}
    tensors: List[torch.Tensor] = []
    for pid, pstate in sorted(state["state"].items()):
        entry: Dict[str, Tuple[Any, ...]] = {}
        for k, v in sorted(pstate.items()):
            if isinstance(v, torch.Tensor):
                entry[k] = ("tensor", tuple(v.shape), v.dtype, len(tensors))
                tensors.append(v)
            else:
                entry[k] = ("value", v)
        layout[pid] = entry
    call = _by_order("broadcast_optimizer_state")
    received = broadcast_object({"layout": layout, "param_groups": state["param_groups"]},
                                root_rank, name=call)
    is_root = rank() == root_rank
    new_state: Dict[Any, Dict[str, Any]] = {}
    for pid, entry in received["layout"].items():
        new_state[pid] = {}
        for k, desc in entry.items():
            if desc[0] == "value":
                new_state[pid][k] = desc[1]
                continue
            _, shape, dtype, index = desc
            t = tensors[index] if is_root else torch.zeros(shape, dtype=dtype)
            _broadcast_(t, root_rank, "%s.%s.%s" % (call, pid, k))
            new_state[pid][k] = t
    if not is_root:
        optimizer.load_state_dict({"state": new_state, "param_groups": received["param_groups"]})
