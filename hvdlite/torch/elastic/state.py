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
from hvdlite.elastic.state import ObjectState
from hvdlite.torch.elastic.sampler import ElasticSampler
from hvdlite.torch.functions import (broadcast_object, broadcast_optimizer_state,
                                     broadcast_parameters)
from hvdlite.basics import rank

__all__ = ["TorchState", "StateHandler", "ModelStateHandler", "OptimizerStateHandler",
           "SamplerStateHandler", "get_handler_registry", "set_handler_registry"]


class StateHandler:
    """Saves, restores and broadcasts one object through its ``state_dict()``."""

    def __init__(self, value) -> None:
        self.value = value
        self.saved = copy.deepcopy(value.state_dict())

    def save(self) -> None:
        self.saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(self.saved)

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


class SamplerStateHandler(StateHandler):
    def sync(self) -> None:
        self.value.load_state_dict(broadcast_object(self.value.state_dict(), root_rank=0))


_registry = [(torch.nn.Module, ModelStateHandler),
             (torch.optim.Optimizer, OptimizerStateHandler),
             (ElasticSampler, SamplerStateHandler)]


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
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self) -> None:
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self) -> None:
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    def _snapshot(self) -> object:
        snapshot = super()._snapshot()
        snapshot["handlers"] = {name: h.saved for name, h in self._handlers.items()}
        return snapshot

    def _load_snapshot(self, snapshot: object) -> None:
        saved = snapshot.get("handlers") if isinstance(snapshot, dict) else None
        if saved is None or set(saved) != set(self._handlers):
            have = sorted(saved) if isinstance(saved, dict) else "none"
            raise ElasticStateError(
                f"the committed state holds the objects {have}, this TorchState "
                f"{sorted(self._handlers)}: build the state with the same keyword arguments")
        for name, handler in self._handlers.items():
            handler.saved = saved[name]
        super()._load_snapshot(snapshot)  # restores every handler and plain value
