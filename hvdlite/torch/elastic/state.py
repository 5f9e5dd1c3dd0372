"""``TorchState``: a model, an optimizer, samplers and plain values, as one elastic state.

Each keyword argument that is a ``torch.nn.Module``, a ``torch.optim.Optimizer``
(a DistributedOptimizer included) or an :class:`ElasticSampler` gets a handler
that saves, restores, broadcasts and commits it through its ``state_dict()``;
every other value is kept as in :class:`~hvdlite.elastic.ObjectState`.
Cross-rank contract: as for :class:`hvdlite.elastic.State`.
"""

from __future__ import annotations

import copy

import torch

from hvdlite.elastic.persistence import ElasticStateError
from hvdlite.elastic.state import ObjectState, _summary_of
from hvdlite.elastic.writer import InBand
from hvdlite.torch.elastic.sampler import ElasticSampler
from hvdlite.torch.sharded import ShardedOptimizer
from hvdlite.torch.functions import (
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from hvdlite.basics import rank

__all__ = [
    "TorchState",
    "StateHandler",
    "ModelStateHandler",
    "OptimizerStateHandler",
    "SamplerStateHandler",
    "get_handler_registry",
    "set_handler_registry",
]


def _copy_into(kept, live):
    """A private copy of the state dict *live*, made in *kept*'s tensors where they fit.

    A tensor of *live* is copied (``copy_``) into the tensor at the same place in
    *kept* when that one has its shape, dtype, device and layout, so a save does
    not allocate (and fault in) a fresh copy of the model every time; anything
    else is copied anew.  Containers are new; only tensors are reused."""
    if isinstance(live, torch.Tensor):
        if (
            isinstance(kept, torch.Tensor)
            and kept.shape == live.shape
            and kept.dtype == live.dtype
            and kept.device == live.device
            and kept.layout == live.layout == torch.strided
            and not kept.requires_grad
            and kept.data_ptr() != live.data_ptr()
        ):
            return kept.copy_(live.detach())
        return live.detach().clone()
    if isinstance(live, dict):
        old = kept if isinstance(kept, dict) else {}
        return _like(live, ((key, _copy_into(old.get(key), value)) for key, value in live.items()))
    if type(live) in (list, tuple):
        old = kept if type(kept) is type(live) and len(kept) == len(live) else [None] * len(live)
        return type(live)(_copy_into(k, v) for k, v in zip(old, live))
    return copy.deepcopy(live)


def _like(original: dict, items) -> dict:
    """A dict of *original*'s type holding *items*, with its ``_metadata`` (which
    ``Module.load_state_dict`` reads for versioned modules) when it has one."""
    made = type(original)(items)
    if hasattr(original, "_metadata"):
        made._metadata = copy.deepcopy(original._metadata)
    return made


class StateHandler:
    """Saves, restores and broadcasts one object through its ``state_dict()``.

    ``saved`` is this handler's private copy: ``save()`` copies the live state
    into the same tensors again (no new allocation), so what ``saved`` holds
    changes at each save -- a background commit write must be done with it
    first (the states see to that).  ``restore()`` loads a copy of it, because
    ``torch.optim.Optimizer.load_state_dict`` keeps the tensors it is given.
    After a synchronous commit on rank 0, ``in_commit`` is set and ``saved`` is
    stale: the saved state is in the commit file (see ``TorchState``)."""

    def __init__(self, value) -> None:
        self.value = value
        self.saved = _copy_into(None, value.state_dict())
        # True on rank 0 after a synchronous commit: the saved state is the one in the
        # commit file, and ``saved`` is stale (TorchState reads it back when needed).
        self.in_commit = False

    def save(self) -> None:
        self.saved = _copy_into(self.saved, self.value.state_dict())
        self.in_commit = False

    def prepare_commit(self) -> None:
        """Every rank, at a commit's start: collective work the state needs first."""

    def live_state(self):
        """The live state rank 0 writes in a synchronous commit."""
        return self.value.state_dict()

    def restore(self) -> None:
        # A copy with every tensor new (nothing to reuse): what load_state_dict may keep.
        self.value.load_state_dict(_copy_into(None, self.saved))

    def sync(self) -> None:
        raise NotImplementedError()

    def set_value(self, value) -> None:
        self.value = value
        self.save()


class ModelStateHandler(StateHandler):
    def sync(self) -> None:
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class OptimizerStateHandler(StateHandler):
    def sync(self) -> None:
        broadcast_optimizer_state(self.value, root_rank=0)


class ShardedOptimizerStateHandler(StateHandler):
    """A sharded optimizer (``shard_optimizer_state=True``): each save first
    gathers the shards' state on every rank (saves run on every rank together),
    so that a restore reshards it, at the same or another number of ranks.  A
    commit gathers it once, on every rank, before rank 0 writes it
    (:meth:`prepare_commit`) and the others save it."""

    def __init__(self, value) -> None:
        value.consolidate_state_dict(to=None)
        super().__init__(value)
        self._prepared = False

    def prepare_commit(self) -> None:
        self.value.consolidate_state_dict(to=None)
        self._prepared = True

    def live_state(self):
        if not self._prepared:
            self.value.consolidate_state_dict(to=None)
        self._prepared = False
        return self.value.state_dict()

    def save(self) -> None:
        if not self._prepared:
            self.value.consolidate_state_dict(to=None)
        self._prepared = False
        super().save()

    def sync(self) -> None:
        self.value.broadcast_state(root_rank=0)


class SamplerStateHandler(StateHandler):
    def sync(self) -> None:
        self.value.load_state_dict(broadcast_object(self.value.state_dict(), root_rank=0))


_registry = [
    (torch.nn.Module, ModelStateHandler),
    (ShardedOptimizer, ShardedOptimizerStateHandler),
    (torch.optim.Optimizer, OptimizerStateHandler),
    (ElasticSampler, SamplerStateHandler),
]


def get_handler_registry() -> list:
    """``[(type, handler class), ...]``: how TorchState recognises what it handles."""
    return _registry


def set_handler_registry(registry: list) -> None:
    global _registry
    _registry = list(registry)


def _handler_for(value) -> StateHandler | None:
    for kind, handler in _registry:
        if isinstance(value, kind):
            return handler(value)
    return None


class TorchState(ObjectState):
    """Horovod's ``TorchState(model=None, optimizer=None, **kwargs)``; see the module doc."""

    def __init__(self, model=None, optimizer=None, **kwargs) -> None:
        kwargs.update(model=model, optimizer=optimizer)
        handlers, plain = {}, {}
        for name, value in kwargs.items():
            handler = _handler_for(value)
            if handler is not None:
                handlers[name] = handler
            else:
                plain[name] = value
        object.__setattr__(self, "_handlers", handlers)
        for name, handler in handlers.items():
            object.__setattr__(self, name, handler.value)
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **plain)

    def __setattr__(self, name, value) -> None:
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers and hasattr(self, name):
            handlers[name].set_value(value)
        super().__setattr__(name, value)

    def save(self) -> None:
        self._settle()  # a background write may still read the saved tensors
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self) -> None:
        self._fetch_committed()
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self) -> None:
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    def _snapshot(self) -> object:
        self._fetch_committed()
        snapshot = super()._snapshot()
        snapshot["handlers"] = {name: h.saved for name, h in self._handlers.items()}
        return snapshot

    def _live_snapshot(self) -> object:
        objects = {name: getattr(self, name) for name in self._saved_state}
        return (
            {
                "objects": InBand(objects),
                "handlers": {name: h.live_state() for name, h in self._handlers.items()},
            },
            _summary_of(objects),
        )

    def _prepare_commit(self) -> None:
        for handler in self._handlers.values():
            handler.prepare_commit()

    def _saved_in_commit(self) -> None:
        for handler in self._handlers.values():
            handler.in_commit = True
        super().save()  # the plain values: a copy in memory, as ever

    def _fetch_committed(self) -> None:
        """Rank 0, after a synchronous commit: read the saved tensors back from it."""
        stale = [name for name, handler in self._handlers.items() if handler.in_commit]
        if not stale:
            return
        commit = self._store().read()
        if commit is None or commit.number != self._commit_number:
            found = "none" if commit is None else f"commit {commit.number}"
            raise ElasticStateError(
                f"restore() needs commit {self._commit_number} from {self._store().path}, "
                f"the saved state of this TorchState, but the file holds {found}: leave the "
                "elastic state directory alone while the job runs"
            )
        saved = commit.load()["handlers"]
        for name in stale:
            self._handlers[name].saved = saved[name]
            self._handlers[name].in_commit = False

    def _load_snapshot(self, snapshot: object) -> None:
        saved = snapshot.get("handlers") if isinstance(snapshot, dict) else None
        if saved is None or set(saved) != set(self._handlers):
            have = sorted(saved) if isinstance(saved, dict) else "none"
            raise ElasticStateError(
                f"the committed state holds the objects {have}, this TorchState "
                f"{sorted(self._handlers)}: build the state with the same keyword arguments"
            )
        for name, handler in self._handlers.items():
            handler.saved = saved[name]
            handler.in_commit = False
        super()._load_snapshot(snapshot)  # restores every handler and plain value
