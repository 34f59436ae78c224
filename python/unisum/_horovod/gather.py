"""Horovod's allgather, reducescatter, alltoall and sparse allreduce on the
C library's gathering collectives.
"""

from __future__ import annotations

import math
import pickle
from typing import Any, Callable, List, Optional, Sequence, Tuple, cast

import torch

from unisum import _capi
from unisum.torch._core import (_DTYPES, _Op, _SigintHold, _kept, _lock, _ops, _pend, _raise_kept,
                                _register)
from unisum.torch._memory import _result
from unisum.torch.ops import _by_order, _declared, _scaled, _undeclare, synchronize
from unisum.torch.compression import Compression
from unisum._capi import UnisumError
from unisum._horovod.basics import Average, ProcessSet, Sum, _Group, _OP_NAMES
from unisum._horovod.common import (_agreed, _claim_name, _gather_launch, _host_only,
                                    _record_check, _records, _refusal, _widened)
from unisum._horovod.slots import (_SLOTS, _Slot, _Spec, _exchange_start, _gate, _may_speculate,
                                   _slot, _slot_file, _slot_next, _slot_wire, _spec_counts,
                                   _speculate, _turns)
from unisum._horovod.reduce import allreduce


def _chain(first: int, stage: Callable[[_Op], Optional[int]],
           release: Callable[[], None], pset: int,
           gate: Optional[Callable[[], None]] = None) -> int:
    """Makes the operation of handle `first` (a small push_pull whose result
    the collective needs) run `stage` once it is done: `stage` sets the
    operation's buffers and output and returns the C handle of the
    collective itself (None: nothing to wait for).  `release` runs when the
    whole operation ends, however it ends.  Stages run in call order per
    process set `pset` (_stages_through), each once its push_pull is
    done and `gate` (if any) lets it."""
    with _lock:
        op = _ops[first]
    first_finish = op.finish

    def end_first() -> None:
        try:
            first_finish()
        finally:
            release()

    op.finish = end_first

    def then(op_: _Op) -> Optional[int]:
        first_finish()          # the small push_pull's own clean-up
        op_.finish = release
        c, finish = stage(op_)

        def end() -> None:
            try:
                finish()
            finally:
                release()
        op_.finish = end
        return c

    op.then, op.gate = then, gate
    _pend(first, pset)
    return first


def allgather_async(tensor: torch.Tensor, name: Optional[str] = None,
                    process_set: Optional[ProcessSet] = None) -> int:
    """Starts concatenating every rank's `tensor` along the first dimension
    (which may differ by rank; the others and the dtype may not); returns
    a handle for synchronize(), which returns the result.  Does not wait:
    the ranks' shapes are exchanged first (as Horovod's coordinator does),
    then the rows (when the layout repeats, the rows start at once, and
    the exchange confirms it: _speculate).  On the servers: each machine
    pushes only its rows and pulls the others'.

    With a `process_set`, its members' tensors, in the order of their
    ranks.

    Raises:
        ValueError: For a `name` that has a collective in flight.  A
            tensor of no dimensions, or of a dtype that cannot be
            gathered, fails at synchronize() on every rank (ValueError or
            TypeError here, HorovodInternalError on the others).
    """
    if _Group(process_set).pset != 0:
        return _allgather_start(tensor, name, process_set)
    with _lock:
        turn = _turns.get("allgather", 0) + 1
    if _slot("allgather", turn, _SLOTS).next is None:
        return _allgather_start(tensor, name, process_set)
    # This call takes a round begun for it (_slot_next): from its
    # exchange, which says this rank speculates, to the supply of its rows
    # a Ctrl-C waits, or that round would never get them here (and the
    # slot's next call would supply it with its own).  Its exchange may
    # first wait for its slot's exchange 8 calls back, which every rank
    # has made.
    hold = _SigintHold(later=True)
    try:
        with hold:
            return _allgather_start(tensor, name, process_set)
    finally:
        hold.deliver()


def _allgather_exchange(src: torch.Tensor, grp: _Group, refused: Optional[Exception]
                        ) -> Tuple[Optional[_Slot], bool, int]:
    """Starts an allgather's exchange of every rank's rows, and whether it
    speculates: its slot (global set only), whether it bets on the slot's
    layout, and the exchange's handle."""
    slot: Optional[_Slot] = None
    bet = False
    if grp.pset == 0:
        with _lock:
            turn = _turns.get("allgather", 0) + 1     # the exchange's, below
        slot = _slot("allgather", turn, _SLOTS)
        # A round begun for this call (_slot_next) is a speculation
        # already, also for a refused call (it runs with zeros).
        bet = slot.next is not None or (refused is None and _may_speculate(slot))
    # Its rows, then whether it speculates.
    table = _records(src, grp,
                     [src.shape[0] if src.dim() else 0, int(bet)], refused, [0, int(bet)])
    first, _ = _exchange_start(table, grp, "allgather")
    return slot, bet, first


def _unspeculate(slot: _Slot, spec: Optional[_Spec], grp: _Group) -> None:
    """Some rank speculated on a layout that did not hold (or the call
    fails): every rank runs that round of the slot's tensor (the others
    with zeros; this rank's speculation `spec` when it made one), left in
    flight as the slot's `ahead`, which the slot's next call ends first
    (its gate), and then undeclares that tensor; the call goes on with a
    new one.  So no stage waits on the others' stages, and poll() never
    waits for data."""
    if spec is not None:
        slot.ahead = spec
    else:
        dtype, counts, _ = slot.layout
        slot.ahead = _speculate(slot, torch.zeros(counts[grp.k], dtype=dtype), grp)
    slot.retired, slot.name = slot.name, None


def _bet(slot: _Slot, src: Optional[torch.Tensor], grp: _Group) -> Optional[_Spec]:
    """An allgather's rows start now, on the slot's layout, before the
    exchange has said it (kept in _specs: its buffers live whatever
    happens); src None: a refused call's zeros.  A rank that said it would
    and does not (None) acts as one that did not."""
    begun = slot.next is not None
    spec = _speculate(slot, src, grp)
    if spec is not None:
        with _lock:
            _spec_counts["started"] += 1
            _spec_counts["begun"] += int(begun)
    return spec


def _allgather_start(tensor: torch.Tensor, name: Optional[str],
                     process_set: Optional[ProcessSet]) -> int:
    """allgather_async's work."""
    grp = _Group(process_set)
    _host_only(tensor, "allgather")
    src = tensor.detach().contiguous()
    refused = _refusal(lambda: _record_check(src, "allgather"))
    release = _claim_name(name, "allgather")
    try:
        slot, bet, first = _allgather_exchange(src, grp, refused)
    except BaseException:
        release()
        raise
    # Reserved once it started: every rank in the same order.
    data_name = _by_order("allgather", pset=grp.pset)
    spec: Optional[_Spec] = None        # set below, once the call is on record

    def stage(op: _Op) -> Tuple[Optional[int], Callable[[], None]]:
        recs = op.output.tolist()
        speculated = any(rec[1] for rec in recs)
        try:
            rows = [rec[0] for rec in _agreed(recs, "allgather", 2, grp, refused)]
        except Exception:
            if speculated:
                _unspeculate(cast(_Slot, slot), spec, grp)
                # A Ctrl-C as the zero round started is not kept for a
                # later call: this one raises already.
                _kept.e = None
            raise
        trailing = list(src.shape[1:])
        per_row = math.prod(trailing)
        send = _widened(src)
        shape = [sum(rows)] + trailing
        counts = [q * per_row for q in rows]
        held = slot is not None and slot.layout == (send.dtype, tuple(counts), tuple(shape))
        recv = spec.recv if spec is not None and held else _result(shape, send.dtype)
        output = recv if send is src else _result(recv.shape, src.dtype)

        def after() -> None:
            if output is not recv:
                output.copy_(recv)

        op.send, op.recv, op.output = send, recv, output
        if speculated and not held:
            _unspeculate(cast(_Slot, slot), spec, grp)
        if spec is None or not held:
            wire, keep = _slot_wire(slot, data_name, send, counts, shape)
            return _gather_launch("allgather", wire, send, recv, counts, after, 0, grp,
                                  keep=keep)
        # The layout held: the others run (or ran) this same round.
        assert slot is not None
        slot.hits += 1
        _spec_counts["held"] += 1
        op.send, op.recv, op.output = spec.send, recv, output
        handle, finish = spec.take()

        def done() -> None:
            finish()
            after()
        return handle, done

    def end() -> None:
        try:
            if spec is not None:
                spec.abandon()  # the call failed before its stage took it
        finally:
            release()

    handle = _chain(_slot_file(slot, first), stage, end, grp.pset, _gate(slot, first))
    if bet:
        spec = _bet(cast(_Slot, slot), src if refused is None else None, grp)
    if slot is not None:
        # Once this call has ended, the slot's next call begins its round.
        with _lock:
            _ops[handle].settled = lambda: _slot_next(cast(_Slot, slot))
    _raise_kept()    # a Ctrl-C as the exchange or the rows started: on record now
    return handle


class _AllgatherFn(torch.autograd.Function):
    """allgather as an autograd function: as in Horovod, the gradient is the
    average over the ranks of the gradient, narrowed to this rank's rows."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: Optional[str],
                process_set: Any) -> torch.Tensor:
        ctx.dim, ctx.process_set = tensor.shape[0] if tensor.dim() else 0, process_set
        return synchronize(allgather_async(tensor, name, process_set))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        reduced = allreduce(grad.contiguous(), average=True, process_set=ctx.process_set)
        dims = allgather(torch.tensor([ctx.dim], dtype=torch.int64),
                         process_set=ctx.process_set)
        offset = int(dims[:_Group(ctx.process_set).k].sum().item())
        return reduced.narrow(0, offset, ctx.dim), None, None


def allgather(tensor: torch.Tensor, name: Optional[str] = None,
              process_set: Optional[ProcessSet] = None) -> torch.Tensor:
    """Every rank's `tensor` concatenated along the first dimension, in rank
    order; differentiable.  See allgather_async()."""
    if tensor.requires_grad and torch.is_grad_enabled():
        out: torch.Tensor = _AllgatherFn.apply(tensor, name, process_set)
        return out
    return synchronize(allgather_async(tensor, name, process_set))


def grouped_allgather(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                      process_set: Optional[ProcessSet] = None) -> List[torch.Tensor]:
    """allgather of each tensor of the list; returns the results in order."""
    return _every([lambda i=i, t=t: allgather(t, None if name is None else "%s.%d" % (name, i),
                                              process_set)
                   for i, t in enumerate(tensors)])


def allgather_object(obj: Any, name: Optional[str] = None,
                     process_set: Optional[ProcessSet] = None) -> List[Any]:
    """Every rank's picklable `obj` (of a `process_set`: its members'), in
    rank order."""
    data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
    sizes = allgather(torch.tensor([data.numel()], dtype=torch.int64),
                      process_set=process_set).tolist()
    gathered = allgather(data, process_set=process_set)
    out, at = [], 0
    for n in sizes:
        out.append(pickle.loads(gathered[at:at + n].numpy().tobytes()))
        at += n
    return out


def _my_rows(rows: int, grp: _Group) -> Tuple[int, int]:
    """This rank's first row and row count of a tensor of `rows` rows split
    over the group's ranks as torch.tensor_split does."""
    n, r = grp.n, grp.k
    base, extra = divmod(rows, n)
    return r * base + min(r, extra), base + (1 if r < extra else 0)


def reducescatter_async(tensor: torch.Tensor, name: Optional[str] = None, op: Optional[int] = None,
                        process_set: Optional[ProcessSet] = None, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0) -> int:
    """Starts reducing `tensor` over the ranks (Average, or Sum) and keeping
    this rank's rows of the result; returns a handle for synchronize().  On
    the servers: every machine pushes the whole tensor and pulls only its
    ranks' rows.  With a `process_set`, over its members (their rows in
    the order of their ranks)."""
    grp = _Group(process_set)
    _host_only(tensor, "reducescatter")
    op = Average if op is None else op
    if op not in (Average, Sum) or tensor.dim() == 0 or tensor.dtype not in _DTYPES:
        # Its call number is used up all the same: this rank's next call
        # must not meet the others' call of this one (their sums would mix
        # two calls' tensors).  In the global set this rank declares that
        # call's tensor as one float16, which the others' is not unless it
        # holds just that: the scheduler refuses it on every rank
        # (EMISMATCH, naming both).  Else (or in a process set) the others
        # wait for this rank until it exits, or name it in a stall report.
        called = _by_order("reducescatter", pset=grp.pset)
        if grp.pset == 0:
            try:
                _declared(called, torch.float16, 1, 0)
                _undeclare(called)
            except UnisumError:
                pass    # another rank declared it first: refused here, and there
        if op not in (Average, Sum):
            raise NotImplementedError("unisum.torch: reducescatter takes op=Average or op=Sum, "
                                      "as Horovod's does; got %s" % _OP_NAMES.get(op, op))
        if tensor.dim() == 0:
            raise ValueError("unisum.torch: reducescatter needs a tensor of at least one "
                             "dimension")
        raise TypeError("unisum.torch: reducescatter of %s tensors is not supported; use one of %s"
                        % (tensor.dtype, ", ".join(str(d) for d in _DTYPES)))
    src = tensor.detach()
    if prescale_factor != 1.0:
        src = _scaled(src, prescale_factor)
    send = src.contiguous()
    n, rows = grp.n, send.shape[0]
    trailing = list(send.shape[1:])
    per_row = math.prod(trailing)
    base, extra = divmod(rows, n)
    counts = [(base + (1 if q < extra else 0)) * per_row for q in range(n)]
    _, mine = _my_rows(rows, grp)
    recv = _result([mine] + trailing, send.dtype)

    def after() -> None:
        if postscale_factor != 1.0:
            recv.copy_(_scaled(recv, postscale_factor))

    release = _claim_name(name, "reducescatter")
    try:
        c, finish = _gather_launch("reducescatter", _by_order("reducescatter", pset=grp.pset),
                                   send, recv, counts, after,
                                   _capi.AVERAGE if op == Average else 0, grp, tuple(send.shape))
    except BaseException:
        release()
        raise

    def end() -> None:
        try:
            finish()
        finally:
            release()

    if c is None:
        end()
        return _register(_Op(None, None, None, recv, lambda: None), done=True)
    handle = _register(_Op(c, send, recv, recv, end))
    _raise_kept()   # a Ctrl-C as it started: it is on record now
    return handle


class _ReducescatterFn(torch.autograd.Function):
    """reducescatter as an autograd function: as in Horovod, the gradient is
    the allgather of the gradient, scaled by size() for Sum and by the
    factors."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: Optional[str], op: int, pre: float,
                post: float, process_set: Any) -> torch.Tensor:
        ctx.args = (op, pre, post, process_set)
        return synchronize(reducescatter_async(tensor, name, op, process_set, pre, post))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        op, pre, post, process_set = ctx.args
        grad = grad * (_Group(process_set).n if op == Sum else 1) * pre * post
        return allgather(grad.contiguous(), process_set=process_set), None, None, None, None, None


def reducescatter(tensor: torch.Tensor, name: Optional[str] = None, compression: Any = None,
                  op: Optional[int] = None, process_set: Optional[ProcessSet] = None,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> torch.Tensor:
    """This rank's rows of the reduction (Average, or Sum) of `tensor` over
    the ranks; differentiable.  See reducescatter_async()."""
    op = Average if op is None else op
    if compression is not None and compression is not Compression.none:
        sent, ctx = compression.compress(tensor)
        return compression.decompress(
            reducescatter(sent, name, None, op, process_set, prescale_factor, postscale_factor),
            ctx)
    if tensor.requires_grad and torch.is_grad_enabled():
        out: torch.Tensor = _ReducescatterFn.apply(tensor, name, op, float(prescale_factor),
                                                   float(postscale_factor), process_set)
        return out
    return synchronize(reducescatter_async(tensor, name, op, process_set, prescale_factor,
                                              postscale_factor))


def grouped_reducescatter(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                          op: Optional[int] = None, process_set: Optional[ProcessSet] = None,
                          prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> List[torch.Tensor]:
    """reducescatter of each tensor of the list, all in flight at once
    (one after the other, differentiable, when some tensor needs a grad)."""
    def named(i: int) -> Optional[str]:
        return None if name is None else "%s.%d" % (name, i)
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return _every([lambda i=i, t=t: reducescatter(t, named(i), None, op, process_set,
                                                       prescale_factor, postscale_factor)
                       for i, t in enumerate(tensors)])
    handles: List[int] = []
    failed: Optional[Exception] = None
    for i, t in enumerate(tensors):
        try:
            handles.append(reducescatter_async(t, named(i), op, process_set,
                                               prescale_factor, postscale_factor))
        except Exception as e:  # noqa: B902 (raised once the others are ended)
            failed = failed or e
    return _every([lambda h=h: synchronize(h) for h in handles], failed)


def _every(calls: List[Callable[[], Any]], failed: Optional[Exception] = None) -> List[Any]:
    """Runs every call of a grouped collective, also after one raised: the
    other ranks run every one (each a call number of its kind), so
    skipping the rest would pair this rank's next calls with their earlier
    ones.  Then raises `failed` (an earlier error of the group), or the
    first exception; else returns the results."""
    out: List[Any] = []
    for call in calls:
        try:
            out.append(call())
        except Exception as e:  # noqa: B902 (raised below)
            failed = failed or e
    if failed is not None:
        raise failed
    return out


def _alltoall_splits(tensor: torch.Tensor, splits: Any, n: int) -> List[int]:
    """The rows alltoall sends to each of n ranks: `splits`, or the rows
    split evenly.  As Horovod: splits other than a tensor are converted to
    int32 (floats truncated); a tensor must hold integers.

    Raises:
        ValueError: For a tensor of no dimensions, or splits that do not
            fit it.
    """
    if tensor.dim() == 0:
        raise ValueError("unisum.torch: alltoall needs a tensor of at least one dimension")
    rows = tensor.shape[0]
    if splits is None:
        if rows % n:
            raise ValueError("unisum.torch: alltoall without splits: the first dimension, "
                             "%d, does not divide by size() = %d" % (rows, n))
        mine = [rows // n] * n
    else:
        try:
            given = (splits if isinstance(splits, torch.Tensor)
                     else torch.tensor(splits, dtype=torch.int32)).flatten()
        except (RuntimeError, TypeError, ValueError, OverflowError) as e:
            raise ValueError("unisum.torch: alltoall: splits %r are not a list of counts: %s"
                             % (splits, e)) from None
        if given.is_floating_point() or given.is_complex() or given.dtype == torch.bool:
            raise ValueError("unisum.torch: alltoall: a splits tensor must hold integers (as "
                             "Horovod's int32 splits), not %s" % given.dtype)
        mine = [int(v) for v in given.tolist()]
        if len(mine) != n or min(mine) < 0 or sum(mine) != rows:
            raise ValueError("unisum.torch: alltoall: splits %s must hold size() = %d "
                             "non-negative counts that add up to the first dimension, %d"
                             % (mine, n, rows))
    return mine


def alltoall_async(tensor: torch.Tensor, splits: Any = None, name: Optional[str] = None,
                   process_set: Optional[ProcessSet] = None) -> int:
    """Starts sending splits[j] rows of `tensor` (in order along the first
    dimension) to rank j, and receiving every rank's rows for this one, in
    rank order; synchronize() returns (the received rows, how many came
    from each rank).  Without `splits` the rows are split evenly.  On the
    servers: each machine pushes only its rows and pulls only those
    addressed to its ranks.  With a `process_set`, among its members:
    splits[j] rows go to its j-th rank.  A tensor of no dimensions, splits
    that do not fit it, or a dtype that cannot be sent, fail at
    synchronize() on every rank (ValueError or TypeError here,
    HorovodInternalError on the others)."""
    grp = _Group(process_set)
    _host_only(tensor, "alltoall")
    n, r = grp.n, grp.k
    mine = [0] * n

    def check() -> None:
        nonlocal mine
        mine = _alltoall_splits(tensor, splits, n)
        _record_check(tensor, "alltoall")
    refused = _refusal(check)
    # Every rank's splits first (without waiting: the rows follow once
    # they are in), with its dimensions and dtype, checked alike on every
    # rank before the rows move.
    src = tensor.detach().contiguous()
    table = _records(src, grp, mine, refused)
    release = _claim_name(name, "alltoall")
    try:
        first, turn = _exchange_start(table, grp, "alltoall")
    except BaseException:
        release()
        raise
    # Reserved once it started: every rank in the same order.
    data_name = _by_order("alltoall", pset=grp.pset)
    slot = _slot("alltoall", turn, _SLOTS) if grp.pset == 0 else None

    def stage(op: _Op) -> Tuple[Optional[int], Callable[[], None]]:
        sent = _agreed(op.output.tolist(), "alltoall", n, grp, refused)   # sent[q][j]: q's rows for j
        trailing = list(src.shape[1:])
        per_row = math.prod(trailing)
        send = _widened(src)
        recv_rows = [sent[q][r] for q in range(n)]
        recv = _result([sum(recv_rows)] + trailing, send.dtype)
        out = recv if send is src else _result(recv.shape, src.dtype)

        def after() -> None:
            if out is not recv:
                out.copy_(recv)

        op.send, op.recv = send, recv
        op.output = (out, torch.tensor(recv_rows, dtype=torch.int32))
        counts = [sent[q][j] * per_row for q in range(n) for j in range(n)]
        wire, keep = _slot_wire(slot, data_name, send, counts)
        return _gather_launch("alltoall", wire, send, recv, counts, after, 0, grp, keep=keep)

    handle = _chain(_slot_file(slot, first), stage, release, grp.pset, _gate(slot, first))
    _raise_kept()    # a Ctrl-C as its exchange started: the call is on record now
    return handle


class _AlltoallFn(torch.autograd.Function):
    """alltoall as an autograd function: as in Horovod, the gradient goes
    back the way the rows came, by an alltoall with the received splits."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, splits: Any, name: Optional[str],
                process_set: Any) -> Any:
        out, recv = synchronize(alltoall_async(tensor, splits, name, process_set))
        ctx.recv, ctx.process_set = recv, process_set
        ctx.mark_non_differentiable(recv)
        return out, recv

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, *unused: Any) -> Any:
        back, _ = synchronize(alltoall_async(grad.contiguous(), ctx.recv, None,
                                                ctx.process_set))
        return back, None, None, None


def alltoall(tensor: torch.Tensor, splits: Any = None, name: Optional[str] = None,
             process_set: Optional[ProcessSet] = None) -> Any:
    """The rows every rank sends this one (see alltoall_async); with
    `splits`, also how many came from each rank.  Differentiable."""
    if tensor.requires_grad and torch.is_grad_enabled():
        out, recv = _AlltoallFn.apply(tensor, splits, name, process_set)
    else:
        out, recv = synchronize(alltoall_async(tensor, splits, name, process_set))
    return out if splits is None else (out, recv)


def sparse_allreduce_async(tensor: torch.Tensor, name: Optional[str] = None,
                           op: Optional[int] = None,
                           process_set: Optional[ProcessSet] = None) -> Callable[[], torch.Tensor]:
    """Horovod's reduction of a sparse COO tensor: every rank's indices and
    values are allgathered (Average divides the values by the number of
    ranks first), and the returned function waits for both and gives the
    sparse sum, uncoalesced, as Horovod's does.

    Raises:
        ValueError: For a tensor that is not sparse, or an op other than
            Average and Sum.
    """
    if not tensor.is_sparse:
        raise ValueError("unisum.torch: sparse_allreduce_async takes a sparse COO tensor; use "
                         "allreduce_async for a dense one")
    op = Average if op is None else op
    if op not in (Average, Sum):
        raise ValueError("unisum.torch: sparse_allreduce_async takes op=Average or op=Sum")
    grp = _Group(process_set)
    _host_only(tensor, "sparse_allreduce")
    indices = tensor._indices().transpose(0, 1).contiguous()
    values = tensor._values()
    if op == Average:
        values = values / grp.n
    ih = allgather_async(indices, None if name is None else "%s.indices" % name, process_set)
    vh = allgather_async(values.contiguous(), None if name is None else "%s.values" % name,
                         process_set)
    size_ = tensor.size()

    def handle() -> torch.Tensor:
        gathered_values = synchronize(vh)
        gathered_indices = synchronize(ih)
        return torch.sparse_coo_tensor(gathered_indices.transpose(0, 1), gathered_values, size_)
    return handle
