"""``HvdliteFabricStrategy``: Lightning Fabric on hvdlite's ranks.

As with the Trainer's :class:`~hvdlite.lightning.HvdliteStrategy`, the launcher
(hvdrun, ``mpiexec``, ``srun``) starts the processes; ``fabric.launch()`` starts
none and only readies this one::

    fabric = L.Fabric(strategy="hvdlite", accelerator="cpu")   # after import hvdlite.lightning
    fabric.launch()
    model, optimizer = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(loader)                   # a DistributedSampler
    ...
    fabric.backward(loss)                                       # gradients averaged here
    optimizer.step()

- ranks and sizes come from hvdlite (``fabric.global_rank`` is ``hvd.rank()``,
  ``fabric.world_size`` is ``hvd.size()``, a process set's with ``process_set=``);
- ``setup_module`` gives every rank rank 0's parameters and buffers;
  ``setup_optimizer`` wraps the optimizer in ``DistributedOptimizer`` (the
  strategy's compression, sharding and reduction options) and gives every rank
  rank 0's optimizer state where it has any;
- ``fabric.backward`` averages the gradients of every optimizer the pass reached
  once it ends, so ``fabric.clip_gradients`` and the step see the averages;
  inside ``fabric.no_backward_sync(model)`` a pass only accumulates;
- ``fabric.all_reduce``, ``all_gather``, ``broadcast`` and ``barrier`` are
  hvdlite collectives; ``fabric.save`` writes once, from rank 0, plain
  ``state_dict()``s that load anywhere.

Cross-rank contract: every rank of the process set makes the same Fabric calls
(setup, backward passes, collectives, save) in the same order.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from lightning.fabric.strategies import ParallelStrategy
from lightning.fabric.strategies.strategy import _BackwardSyncControl

import hvdlite.torch as hvd
from hvdlite.lightning.collectives import HvdliteCollectives
from hvdlite.lightning.environment import HvdliteEnvironment
from hvdlite.lightning.strategy import (
    _UNCOUNTED,
    _check_started_by_launcher,
    _start_hvdlite,
    check_process_set,
    wrap_optimizer,
)
from hvdlite.torch.compressors import StatefulCompressor
from hvdlite.torch.grad_hooks import on_grad_accumulated

__all__ = ["HvdliteFabricStrategy"]


class HvdliteFabricStrategy(HvdliteCollectives, ParallelStrategy):
    """Data-parallel Fabric on the ranks hvdlite's launcher started.

    ``Fabric(strategy="hvdlite")`` after ``import hvdlite.lightning``, or
    ``Fabric(strategy=HvdliteFabricStrategy(...))`` with the options of
    :class:`~hvdlite.lightning.HvdliteStrategy`: ``compression``,
    ``shard_optimizer_state``, ``process_set``, ``hierarchical_allreduce``, ``op``,
    ``gradient_predivide_factor``, ``bucket_cap_mb``, ``sparse_as_dense``.
    """

    strategy_name = "hvdlite"

    def __init__(
        self,
        accelerator=None,
        parallel_devices: list[torch.device] | None = None,
        checkpoint_io=None,
        precision=None,
        *,
        compression=hvd.Compression.none,
        shard_optimizer_state: bool = False,
        process_set=hvd.global_process_set,
        hierarchical_allreduce: bool | None = None,
        op=hvd.Average,
        gradient_predivide_factor: float = 1.0,
        bucket_cap_mb: float | None = None,
        sparse_as_dense: bool = False,
    ) -> None:
        _start_hvdlite(hierarchical_allreduce)
        check_process_set(process_set, type(self).__name__)
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=HvdliteEnvironment(process_set),
            checkpoint_io=checkpoint_io,
            precision=precision,
        )
        self.process_set = process_set
        self._options = {
            "op": op,
            "gradient_predivide_factor": gradient_predivide_factor,
            "bucket_cap_mb": bucket_cap_mb,
            "sparse_as_dense": sparse_as_dense,
            "shard_optimizer_state": shard_optimizer_state,
        }
        self._compression = compression
        self._backward_sync_control = _NoSync(self)
        self._sync_blocked = False
        self._named: list = []  # the set-up modules' named parameters
        self._optimizers: list = []  # the DistributedOptimizers, in setup order
        self._reached: set[int] = set()  # optimizers this backward pass reached
        self._hooks: list = []
        self._skips = contextlib.ExitStack()
        _check_started_by_launcher()

    @property
    def root_device(self) -> torch.device:
        devices = self.parallel_devices
        if devices and devices[0].type != "cpu":
            return devices[self.local_rank % len(devices)]  # ranks may share a GPU
        return torch.device("cpu")

    def module_to_device(self, module: torch.nn.Module) -> None:
        if self.root_device.type == "cuda":
            torch.cuda.set_device(self.root_device)
        module.to(self.root_device)

    # ------------------------------------------------------------------ setup

    def setup_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Rank 0's parameters and buffers on every rank; the module stays as it is."""
        hvd.broadcast_parameters(
            module.state_dict(), root_rank=self._root(), process_set=self.process_set
        )
        self._named.extend(module.named_parameters())
        return module

    def setup_optimizer(self, optimizer):
        """*optimizer* in a ``DistributedOptimizer`` whose reductions
        :meth:`backward` starts (collective: every rank sets up the same ones)."""
        if isinstance(self._compression, StatefulCompressor) and self._optimizers:
            raise ValueError(
                f"compression={type(self._compression).__name__} keeps state for one "
                "optimizer, and Fabric set up a second: pass a function that builds one "
                "per optimizer, e.g. compression=lambda: hvd.Compression.topk(0.01)."
            )
        distributed = wrap_optimizer(
            optimizer, self._named, self._compression, _UNCOUNTED, self.process_set, self._options
        )
        index = len(self._optimizers)
        self._optimizers.append(distributed)
        self._skips.enter_context(distributed.skip_synchronize())  # step() reduces nothing
        for group in distributed.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    self._hooks.append(on_grad_accumulated(p, self._reach(index)))
        return distributed

    def _reach(self, index: int):
        reached = self._reached

        def hook(_):
            reached.add(index)

        return hook

    def teardown(self) -> None:
        self._skips.close()
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()
        super().teardown()

    # -------------------------------------------------------------- gradients

    def backward(self, tensor: torch.Tensor, module, *args: Any, **kwargs: Any) -> None:
        """The backward pass, then the average of every gradient it produced (unless
        inside ``no_backward_sync``).  Every rank runs the same passes, so each makes
        the same choice."""
        self._reached.clear()
        super().backward(tensor, module, *args, **kwargs)
        if self._sync_blocked:
            return
        for index in sorted(self._reached):
            self._optimizers[index].synchronize()
        self._reached.clear()

    @classmethod
    def register_strategies(cls, strategy_registry) -> None:
        if cls.strategy_name not in strategy_registry:
            strategy_registry.register(
                cls.strategy_name,
                cls,
                description="data-parallel Fabric on hvdlite (MPI): run under hvdrun",
            )


class _NoSync(_BackwardSyncControl):
    """``fabric.no_backward_sync(model)``: the passes inside only accumulate."""

    def __init__(self, strategy: HvdliteFabricStrategy):
        self._strategy = strategy

    @contextlib.contextmanager
    def no_backward_sync(self, module, enabled: bool):
        strategy = self._strategy
        blocked = strategy._sync_blocked
        strategy._sync_blocked = blocked or enabled
        try:
            yield
        finally:
            strategy._sync_blocked = blocked
