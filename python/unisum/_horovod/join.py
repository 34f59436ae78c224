"""Horovod's join(): a rank out of data contributes zeros until every rank
has joined.
"""

from __future__ import annotations

from typing import Any, List, Optional

import torch

from unisum import _capi
from unisum.torch._core import (_SigintHold, _calls, _lock, _require_init, _settle_stages,
                                register_rejoin_hook)
from unisum.torch.ops import _start, synchronize
from unisum._horovod.basics import _Group
from unisum._horovod.slots import _SLOTS, _slots, _slots_forget, _speculate, _turns


def join(device: int = -1) -> int:
    """Horovod's join: this worker has no more data.  Until every worker
    has joined it contributes zeros to the allreduces the others run (an
    Average still divides by size()); their broadcasts and gathering
    collectives raise meanwhile.  Returns the rank that joined last, the
    same on every worker.  `device` is taken and unused (CPU tensors).

    A Ctrl-C while it waits comes once the join has ended (the C call
    cannot be stopped), and the next join() is taken for that one, retried:
    it returns its answer at once.

    Raises:
        UnisumError: When the job fails meanwhile.
    """
    global _join_kept
    del device
    _require_init()
    if _join_kept is not None:
        # The last call's join ended as a Ctrl-C came: this call is that
        # one (a new join would be one ahead of every other worker's).
        last, _join_kept = _join_kept, None
        return last
    # This worker's collectives begin before it joins: every second stage
    # runs first (the C library then waits for the operations themselves).
    _settle_stages()
    # unisum_join blocks until every worker has joined (a Ctrl-C cannot
    # stop it), and what follows it must all run: a Ctrl-C comes after,
    # and the next join() returns this one's answer.
    with _SigintHold():
        last = _capi.check(_capi.lib.unisum_join(), "unisum.torch.join")
        # A joined worker ran none of the others' unnamed collectives: every
        # worker takes the largest counts, so the next names and slots agree.
        kinds = ("allgather", "alltoall")
        with _lock:
            begun = [int(_slots.get(("allgather", i)) is not None
                         and _slots[("allgather", i)].next is not None) for i in range(_SLOTS)]
        counts = torch.tensor([_calls.get(0, 0)] + [_turns.get(k, 0) for k in kinds] + begun,
                              dtype=torch.int64)
        got = synchronize(_start(counts, False, "unisum.join.counts", 0, True,
                                       flags=_capi.MAX)).tolist()
        with _lock:
            _calls[0] = int(got[0])
            _turns.update(zip(kinds, (int(v) for v in got[1:1 + len(kinds)])))
        # A slot's next round that some rank began (_slot_next) and this
        # one did not (its call ended after a rank had joined, say): this
        # one runs it with zeros, so that every rank's ends.
        for i, anyone in enumerate(got[1 + len(kinds):]):
            slot = _slots.get(("allgather", i))
            if anyone and slot is not None and slot.next is None and slot.name is not None:
                slot.next = _speculate(slot, None, _Group(None))
        # Every rank is here, none in a gathering collective: the slots start
        # afresh (one may hold a tensor that join poisoned).
        _slots_forget(rejoin=False)
        _join_kept = int(last)      # until it is returned: a held Ctrl-C comes first
    _join_kept = None
    return int(last)


# join(): the last call's join ended, but a Ctrl-C came before it returned.
_join_kept: Optional[int] = None


def _on_rejoin() -> List[Any]:
    """The job re-forms (rejoin): a kept join result is of the ended
    membership, and the slots start afresh; returns what must stay held
    until the C library has ended every operation (the speculative
    rounds' buffers)."""
    global _join_kept
    _join_kept = None
    return _slots_forget(rejoin=True)


register_rejoin_hook(_on_rejoin)
