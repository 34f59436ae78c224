"""Elastic training for unisum.torch, with Horovod's names (``hvd.elastic``).

    import unisum.torch as hvd

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            for state.batch in range(state.batch, batches):
                ...one step...
                if state.batch % 10 == 0:
                    state.commit()
            state.batch = 0

    state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)
    train(state)

Run under ``unisum launch --elastic --min-workers A --max-workers B``.  When
a worker is lost, every other worker's next collective raises
:class:`unisum.UnisumError` with code ``EMEMBERSHIP``; ``run`` then
restores the last commit, rejoins the job at its new size
(:func:`unisum.torch.rejoin`: ranks are dense again, tensors are declared
afresh) and broadcasts rank 0's state (``sync``) before calling the
function again.  Workers that start while the job runs wait until the
next ``commit()``, which raises :class:`HostsUpdatedInterrupt` on every
worker; they enter there and receive the state by the same broadcast.

Choices: ``sync()`` also commits (a restore after it goes back to the
state every worker agreed on); state is always synchronised after a
re-form, even when workers were only added (Horovod may skip it).
"""

from __future__ import annotations

import copy
import functools
import math
import random
from typing import Any, Callable, Dict, Iterator, List, Optional, TypeVar

import torch

from unisum import _capi
from unisum._capi import UnisumError
from unisum.torch._core import rank, size
from unisum.torch._runtime import membership_changed, rejoin
from unisum.torch.functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters
from unisum._horovod.gather import allgather_object

__all__ = ["run", "State", "ObjectState", "TorchState", "ElasticSampler",
           "HostsUpdatedInterrupt", "HorovodInternalError"]

HorovodInternalError = UnisumError

_F = TypeVar("_F", bound=Callable[..., Any])


class HostsUpdatedInterrupt(RuntimeError):
    """Raised by ``State.commit()`` when workers wait to join (or the job
    already re-forms): ``run`` rejoins and goes on from the commit just
    made, without restoring.

    Args:
        skip_sync: Horovod's: whether the state need not be broadcast
            again.  unisum always broadcasts it (newcomers need it).
    """

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("the job's workers changed")
        self.skip_sync = skip_sync


def _us() -> Any:
    """The API names elastic training uses, each from its own module (the
    unisum.torch façade imports this module, so it never imports that)."""
    from types import SimpleNamespace
    return SimpleNamespace(rank=rank, size=size, membership_changed=membership_changed,
                           rejoin=rejoin, broadcast_object=broadcast_object,
                           broadcast_parameters=broadcast_parameters,
                           broadcast_optimizer_state=broadcast_optimizer_state,
                           allgather_object=allgather_object)


class State:
    """What ``run`` saves, restores and broadcasts.  Subclasses implement
    save(), restore() and sync()."""

    def __init__(self) -> None:
        self._reset_callbacks: List[Callable[[], None]] = []

    def register_reset_callbacks(self, callbacks: List[Callable[[], None]]) -> None:
        """Functions called after every re-form (to scale the learning
        rate to the new size, say)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Saves the state (the point a lost worker rolls the others back
        to), then raises HostsUpdatedInterrupt when workers wait to join."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        if _us().membership_changed():
            raise HostsUpdatedInterrupt(False)

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError


class ObjectState(State):
    """Plain attributes (``epoch=0, batch=0``), saved by deep copy and
    synchronised from rank 0 with broadcast_object."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self._names = list(kwargs)
        for name, value in kwargs.items():
            setattr(self, name, value)
        self._saved: Dict[str, Any] = {}
        ObjectState.save(self)

    def save(self) -> None:
        self._saved = {n: copy.deepcopy(getattr(self, n)) for n in self._names}

    def restore(self) -> None:
        for name, value in self._saved.items():
            setattr(self, name, copy.deepcopy(value))

    def sync(self) -> None:
        if self._names:
            values = _us().broadcast_object({n: getattr(self, n) for n in self._names}, 0,
                                            name="elastic.state.objects")
            for name, value in values.items():
                setattr(self, name, value)
        ObjectState.save(self)


class ElasticSampler(torch.utils.data.Sampler):
    """Shards a dataset over the current workers, as Horovod's: the
    indices an epoch has processed (``record_batch``, on every worker) are
    not given out again after a re-form, which re-shards the rest over the
    new number of workers.

    Args:
        dataset: What is sampled (only its length is used).
        shuffle: Shuffle every epoch (seeded by seed + epoch: the same on
            every worker).
        seed: The shuffle's seed.
    """

    def __init__(self, dataset: Any, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices: set = set()
        self.indices: List[int] = []
        self.num_samples = 0
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def get_indices(self, batch_idx: int, batch_size: int) -> List[int]:
        start = batch_idx * batch_size
        return self.indices[start:start + batch_size]

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        self.record_indices(self.get_indices(batch_idx, batch_size))

    def record_indices(self, indices: Any) -> None:
        self.processed_indices.update(indices)

    def state_dict(self) -> Dict[str, Any]:
        return {"epoch": self.epoch, "processed_indices": set(self.processed_indices)}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.epoch = state["epoch"]
        self.processed_indices = set(state["processed_indices"])
        self.reset()

    def reset(self) -> None:
        us = _us()
        replicas, rank = us.size(), us.rank()
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        left = [i for i in order if i not in self.processed_indices]
        self.num_samples = int(math.ceil(len(left) / replicas)) if left else 0
        total = self.num_samples * replicas
        left += left[:total - len(left)]      # every worker the same number of steps
        self.indices = left[rank:total:replicas]

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return self.num_samples


class TorchState(ObjectState):
    """A model, an optimizer and plain attributes (``epoch``, ``batch``;
    an ElasticSampler too): ``commit()`` saves them in memory,
    ``restore()`` goes back to the last commit, ``sync()`` broadcasts
    rank 0's (the model's parameters and buffers, the optimizer's state,
    the attributes; a sampler's processed indices are the union over the
    workers)."""

    def __init__(self, model: Optional[torch.nn.Module] = None,
                 optimizer: Optional[torch.optim.Optimizer] = None, **kwargs: Any) -> None:
        self.model = model
        self.optimizer = optimizer
        self._samplers = {n: v for n, v in kwargs.items() if isinstance(v, ElasticSampler)}
        plain = {n: v for n, v in kwargs.items() if n not in self._samplers}
        for name, sampler in self._samplers.items():
            setattr(self, name, sampler)
        self._model_saved: Optional[Dict[str, Any]] = None
        self._opt_saved: Optional[Dict[str, Any]] = None
        self._sampler_saved: Dict[str, Dict[str, Any]] = {}
        super().__init__(**plain)
        self.save()

    def save(self) -> None:
        if self.model is not None:
            self._model_saved = copy.deepcopy(self.model.state_dict())
        if self.optimizer is not None:
            self._opt_saved = copy.deepcopy(self.optimizer.state_dict())
        self._sampler_saved = {n: s.state_dict() for n, s in self._samplers.items()}
        ObjectState.save(self)

    def restore(self) -> None:
        if self.model is not None and self._model_saved is not None:
            self.model.load_state_dict(self._model_saved)
        if self.optimizer is not None and self._opt_saved is not None:
            self.optimizer.load_state_dict(self._opt_saved)
        for name, state in self._sampler_saved.items():
            self._samplers[name].load_state_dict(state)
        ObjectState.restore(self)

    def sync(self) -> None:
        us = _us()
        if self.model is not None:
            us.broadcast_parameters(self.model.state_dict(), root_rank=0)
        if self.optimizer is not None:
            us.broadcast_optimizer_state(self.optimizer, root_rank=0)
        for name, sampler in sorted(self._samplers.items()):
            state = sampler.state_dict()
            seen: set = set()
            for part in us.allgather_object(state["processed_indices"],
                                            name="elastic.sampler." + name):
                seen |= part
            state["processed_indices"] = seen
            sampler.load_state_dict(us.broadcast_object(state, 0, name="elastic.sampler." + name))
        ObjectState.sync(self)
        self.save()


def run(func: _F) -> _F:
    """Wraps a training function ``func(state, *args, **kwargs)``: runs it
    after broadcasting rank 0's state; when the job re-forms (a collective
    raises UnisumError with code EMEMBERSHIP: a worker was lost), restores
    the last commit, rejoins and calls it again; when commit() raises
    HostsUpdatedInterrupt (workers join), rejoins without restoring.  Any
    other error (the job failed: fewer workers than --min-workers, say)
    propagates."""

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        us = _us()
        while True:
            try:
                state.sync()
                return func(state, *args, **kwargs)
            except UnisumError as e:
                if e.code != _capi.EMEMBERSHIP:
                    raise
                state.restore()
            except HostsUpdatedInterrupt:
                pass
            us.rejoin()
            state.on_reset()

    return wrapper  # type: ignore[return-value]
