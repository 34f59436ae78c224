"""The tensors that unnamed gathering collectives reuse (slots), taking turns
per kind, and the speculation that starts an allgather's rows before its
shapes are exchanged.
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable, List, Optional, Sequence, Tuple, cast

import torch

from unisum import _capi
from unisum.torch import _core
from unisum.torch._core import _SigintHold, _WAIT_SLICE_MS, _lock, _ops, _poll, _settle, _step
from unisum.torch._memory import _result
from unisum.torch.ops import _declared, _start, _undeclare
from unisum._horovod.basics import _Group
from unisum._horovod.common import _gather_launch, _widened


# ---- the tensors that unnamed gathering collectives reuse ----
#
# A one-shot tensor costs three scheduler round trips a call (its
# declaration, the homed cut's, its undeclaration) and fresh buffers on the
# servers, whose first touch is page faults: 2-5 ms of a 4 MiB allgather's
# 35 ms on the emulated cluster.  So the allgathers and alltoalls of the
# global set take turns, by their count per kind (_exchange_start), on _SLOTS
# tensors per kind (2: with 4, 64 MiB allgathers ran 20-30% slower for
# their first 12 turns on the emulated cluster, cause not found; 2 still
# lets one call's data start while the last one's is in flight).  A slot's tensor
# carries one layout (dtype, counts); a call of another layout declares a
# new one, named after the call (which every rank agrees on, join()
# included), and undeclares the old.  Every rank sees the same layouts (the
# exchange said them, checked alike on every rank), and a call's stage runs
# only once every earlier call on its slot has ended here (its gate,
# _slot_free), so every rank runs a slot's calls in call order and names
# the same tensor for a call.  The C library keeps each tensor's homed cut:
# a call whose layout repeats declares nothing.  Results above _SLOT_BYTES
# stay one-shot (a slot's buffers on the servers outlive the call), and so
# do reducescatters: their layout comes from each rank's own tensor, so
# ranks that disagree must meet on one name to be refused (EMISMATCH).
# The exchanges take turns on _SHAPE_SLOTS tensors per kind; starting one
# waits for the slot's last exchange, which needs only every rank's call.
# An allgather whose slot's layout repeated may start its rows before its
# exchange (_speculate).
_SLOTS = 2
_SHAPE_SLOTS = 8
_SLOT_BYTES = 64 << 20


class _Slot:
    """One reused tensor: its current name and layout, and the handles of
    the calls filed on it, in call order."""

    __slots__ = ("kind", "index", "name", "layout", "users", "hits", "ahead", "retired", "next")

    def __init__(self, kind: str, index: int) -> None:
        self.kind, self.index = kind, index
        self.name: Optional[str] = None
        self.layout: Any = None         # (dtype, counts, the result's shape)
        self.users: List[int] = []
        self.hits = 0                   # calls since the last new layout
        # A round of its tensor that no call waits for (a speculation whose
        # layout did not hold), ended before the slot's next call runs.
        self.ahead: Optional[_Spec] = None
        self.retired: Optional[str] = None     # its old tensor, undeclared once ahead ends
        # Its next call's round, begun without this rank's rows (_slot_next).
        self.next: Optional[_Spec] = None


_slots: dict = {}


def _slot(kind: str, call: int, turns: int) -> _Slot:
    """The slot of kind `kind` that call number `call` takes."""
    with _lock:
        key = (kind, call % turns)
        got = _slots.get(key)
        if got is None:
            got = _slots[key] = _Slot(kind, call % turns)
        return got


_turns: dict = {}   # kind -> the global set's calls of that kind so far (slots' turns)


def _slot_file(slot: Optional[_Slot], handle: int) -> int:
    """Files `handle` as `slot`'s latest user; returns it."""
    if slot is not None:
        with _lock:
            slot.users.append(handle)
    return handle


def _slot_end_ahead(slot: _Slot) -> None:
    """Waits for the slot's round that no call waits for, if any, and
    undeclares the tensor it ran on."""
    if slot.ahead is not None:
        slot.ahead.drain()
        slot.ahead = None
    if slot.retired is not None:
        retired, slot.retired = slot.retired, None
        _undeclare(retired)


def _slot_free(slot: _Slot, handle: Optional[int]) -> None:
    """The gate of call `handle` on `slot` (None: a call not filed yet):
    waits until every call filed on it before (their stages ran: they
    came first) has ended here (each needs only the other ranks' stages,
    which they start in call order too), and forgets them."""
    _slot_end_ahead(slot)
    with _lock:
        if handle is None:
            earlier = list(slot.users)
        else:
            earlier = slot.users[:slot.users.index(handle)] if handle in slot.users else []
    for h in earlier:
        with _lock:
            op = _ops.get(h)
        if op is not None:
            _settle(h, op)
    with _lock:
        slot.users = [h for h in slot.users if h not in earlier]


def _gate(slot: Optional[_Slot], handle: int) -> Optional[Callable[[], None]]:
    """The gate of call `handle`'s stage: `slot` free (None: no slot)."""
    return None if slot is None else (lambda: _slot_free(slot, handle))


def _slot_wire(slot: Optional[_Slot], one_shot: str, send: torch.Tensor,
               counts: List[int], shape: Optional[Sequence[int]] = None) -> Tuple[str, bool]:
    """The tensor a call runs its `counts` of `send`'s dtype on (into a
    result of `shape`, when every rank's is the same), and whether it is a slot's (kept declared):
    `slot`'s, unless the whole exceeds _SLOT_BYTES or there is no slot (a
    process set); else `one_shot`, the call's own name.  A slot's new
    tensor is named after it, which every rank agrees on (join() included)
    and no call reuses.  Runs in the call's stage, its gate open."""
    if slot is None or sum(counts) * send.element_size() > _SLOT_BYTES:
        return one_shot, False
    layout = (send.dtype, tuple(counts), None if shape is None else tuple(shape))
    if slot.name is None or slot.layout != layout:
        if slot.name is not None:
            _undeclare(slot.name)
        slot.name = "unisum.%s.slot%d" % (one_shot, slot.index)
        slot.layout, slot.hits = layout, 0
    else:
        slot.hits += 1
    return slot.name, True


class _Spec:
    """An allgather started on its slot's layout before the shapes'
    exchange has said whether that layout holds (allgather_async): its C
    handle (None once its call took it over or it ended) and buffers.
    Until then it is in _specs, so its buffers live while the C
    library writes into them, whatever happens to the call."""

    __slots__ = ("handle", "send", "recv", "finish")

    def __init__(self, handle: int, send: torch.Tensor, recv: torch.Tensor,
                 finish: Callable[[], None]) -> None:
        self.handle: Optional[int] = handle
        self.send, self.recv, self.finish = send, recv, finish

    def take(self) -> Tuple[Optional[int], Callable[[], None]]:
        """Its C handle and finish, for the call's stage to wait on: the
        layout held."""
        handle, self.handle = self.handle, None
        with _lock:
            _specs.discard(self)
        return handle, self.finish

    def abandon(self) -> None:
        """Lets it go when its call failed before its stage: released if
        it has ended, else left in _specs (its buffers held) rather than
        waited for, since the others may never run its round."""
        if self.handle is not None and _poll(self.handle, 0) != 0:
            self.handle = None
        if self.handle is None:
            with _lock:
                _specs.discard(self)

    def drain(self) -> None:
        """Waits until it has ended, unless taken over or ended (every rank
        started its round, so it ends or fails in bounded time).  In
        slices, so that Ctrl-C can interrupt; it then stays in flight."""
        while self.handle is not None:
            rc = 0
            try:
                rc = _poll(self.handle, _WAIT_SLICE_MS)
            finally:
                if rc != 0:
                    self.handle = None  # done or failed: released either way
        with _lock:
            _specs.discard(self)


_specs: set = set()


# Speculations, those whose layout held, and those on a round begun before the call.
_spec_counts = {"started": 0, "held": 0, "begun": 0}


def _slot_busy(slot: _Slot) -> bool:
    """Whether a call filed on `slot` has not ended here."""
    with _lock:
        return any(h in _ops and not _ops[h].done for h in slot.users)


def _may_speculate(slot: _Slot) -> bool:
    """Whether an allgather on `slot` starts its rows before the shapes'
    exchange has said the layout (_speculate): when the slot's last call
    repeated the layout before it (in training shapes rarely change), so
    the rows need not wait for the exchange's round trip.  Only once the
    slot's last call has ended here (its stage run, its operation done),
    so it never waits: ranks may decide differently, and each says in its
    exchange row whether it does.  Every rank's stage then knows (see
    allgather_async): the layout held, and the others run that same round
    of the tensor; or it changed, and they run that round with zeros, so
    every speculation ends, before the new layout.  Only with one worker a
    machine (every machine has as many): the workers of a machine start
    their operations in one order (their local reduce takes them so),
    which decisions that differ would break."""
    if _capi.lib.unisum_local_size() > 1:
        return False
    if slot.ahead is not None:
        slot.ahead.abandon()    # released if it has ended
        if slot.ahead.handle is not None:
            return False
    if _slot_busy(slot):
        return False
    _slot_free(slot, None)      # forgets its ended calls
    return slot.name is not None and slot.hits >= 1


def _speculate(slot: _Slot, src: Optional[torch.Tensor], grp: _Group) -> Optional[_Spec]:
    """Starts the allgather of `src` on `slot`'s tensor in its layout (a
    rank whose tensor does not fit it, or without one, pushes zeros), or
    supplies it to the round begun already (`slot.next`); None when
    refused (a rank joined: the exchange says so) or there is nothing to
    move."""
    dtype, counts, shape = slot.layout
    send = _widened(src) if src is not None else None
    if send is None or send.dtype != dtype or send.numel() != counts[grp.k]:
        send = torch.zeros(counts[grp.k], dtype=dtype)
    if slot.next is not None:
        # Every caller holds SIGINT (allgather_async, a stage, join()):
        # the round gets its rows here or stays the slot's.
        spec = slot.next
        spec.send = send
        _capi.check(_capi.lib.unisum_allgather_supply(cast(int, spec.handle), send.data_ptr()),
                    "unisum.torch: allgather")
        slot.next = None
        return spec
    recv = _result(shape, dtype)
    try:
        handle, finish = _gather_launch("allgather", cast(str, slot.name), send, recv,
                                        list(counts), lambda: None, keep=True)
    except _capi.UnisumError:
        return None
    if handle is None:
        return None
    spec = _Spec(handle, send, recv, finish)
    with _lock:
        _specs.add(spec)
    return spec


def _slot_next(slot: _Slot) -> None:
    """Begins the round of `slot`'s next call now, without this rank's rows
    (unisum_allgather_begin): this machine's pulls of the others' rows go
    out at once, so a late rank's inbound data flows before its call
    instead of after it (bench/README.md).  Its next call speculates on
    it (_speculate supplies the rows, or zeros), and says so in its
    exchange, so a layout that changed or a refused call still runs that
    round on every rank.  Only when the slot's calls have all ended here
    and the layout repeated (_may_speculate's conditions), one worker a
    machine.  Run by synchronize() as the slot's last call returns (a
    Ctrl-C as it starts is raised there, the call's handle kept for a
    retry)."""
    if (slot.next is not None or slot.ahead is not None or slot.retired is not None
            or slot.name is None or slot.hits < 1 or not _core._initialized
            or _capi.lib.unisum_local_size() > 1 or _slot_busy(slot)):
        return
    dtype, counts, shape = slot.layout
    total = sum(counts)
    if total == 0:
        return
    tid = _declared(slot.name, dtype, total, 0)
    recv = _result(shape, dtype)
    arr = (ctypes.c_uint64 * len(counts))(*counts)
    h = ctypes.c_int64(0)
    # A Ctrl-C waits until the round is on record (the slot's), then
    # comes from synchronize(), its call's handle still there.
    with _SigintHold(later=True) as hold:
        rc = _capi.lib.unisum_allgather_begin(tid, recv.data_ptr(), arr, ctypes.byref(h))
        if rc == 0:
            spec = _Spec(h.value, recv, recv, lambda: None)
            with _lock:
                _specs.add(spec)
            slot.next = spec
    hold.deliver()      # else the next call speculates as it would have


def _exchange_start(table: torch.Tensor, grp: _Group, kind: str) -> Tuple[int, int]:
    """Starts the small push_pull (a sum) of `table`, in which each rank
    filled its own row, that a gathering collective waits for (a Ctrl-C as
    it starts stays held: the caller raises it with _raise_kept once
    the call is chained); returns its
    handle and the call's turn, its number among the global set's calls of
    `kind` (which slots it takes; 0 in a process set, which has none),
    counted once the push_pull has started.  In the global set it runs on
    the exchange slot of its turn, once the slot's last exchange is done
    (which needs only every rank's call)."""
    if grp.pset != 0:
        return _start(table, False, None, 0, False, pset=grp.pset, raise_kept=False), 0
    with _lock:
        turn = _turns.get(kind, 0) + 1
    slot = _slot(kind + ".exchange", turn, _SHAPE_SLOTS)
    with _lock:
        earlier = list(slot.users)
    for h in earlier:
        # Its push_pull done (released), unless its stage ran already:
        # needs only every rank's call.
        with _lock:
            op = _ops.get(h)
        if op is not None and op.then is not None:
            _step(op, True)
    with _lock:
        slot.users = [h for h in slot.users if h not in earlier]
    handle = _slot_file(slot, _start(table, False, "unisum.%s.exchange.slot%d.%d"
                                         % (kind, slot.index, table.numel()), 0, False,
                                         raise_kept=False))
    with _lock:
        _turns[kind] = turn
    return handle, turn


def _slots_forget(rejoin: bool) -> List[Any]:
    """After rejoin() (the tensors gone with the membership, the calls
    counted afresh), forgets every slot.  After join() (which every rank
    calls, none in a gathering collective), undeclares the collectives'
    slot tensors, one of which join may have poisoned; the next use
    declares a new one under its call number.  The exchange slots stay: a
    joined rank ran their push_pulls for the others, so their rounds are
    in step.  Returns what the caller holds until the C library has ended
    the membership's operations (rejoin: the speculative rounds, whose
    buffers it may still write)."""
    with _lock:
        if rejoin:
            held = list(_specs) + [slot.ahead for slot in _slots.values()]
            _slots.clear()
            _turns.clear()
            _specs.clear()      # rounds of the old membership's tensors
            return held
        retired = [slot for slot in _slots.values() if not slot.kind.endswith(".exchange")
                   and (slot.name is not None or slot.retired is not None)]
    for slot in retired:
        # Their operations ended (unisum_join waited for them); their
        # handles are released here, or the tensor would still be busy.
        for h in slot.users:
            with _lock:
                op = _ops.get(h)
            if op is not None and op.then is None:
                _step(op, True)
        _slot_end_ahead(slot)   # every rank started it (unisum_join waited too)
        if slot.next is not None:
            # Begun for a call that never came: unisum_join supplied
            # nothing, on every rank, so it ends.
            slot.next.drain()
            slot.next = None
        name, slot.name, slot.layout, slot.users, slot.hits = slot.name, None, None, [], 0
        if name is not None:
            _undeclare(name)
    return []
