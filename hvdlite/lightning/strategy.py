"""``HvdliteStrategy``: Lightning's ``Trainer`` on hvdlite's ranks.

The launcher (hvdrun, ``mpiexec``, ``srun``) starts one process per rank and each
runs the same script; the strategy only joins what is already running:

- ranks, sizes and the node index come from hvdlite (:mod:`.environment`), so
  ``trainer.global_rank`` and ``trainer.world_size`` are ``hvd.rank()`` and
  ``hvd.size()`` (a process set's, with ``process_set=``), and Lightning gives every
  training dataloader its ``DistributedSampler`` with those numbers;
- at setup rank 0's parameters and buffers (and optimizer state, where it has
  any) reach every rank, and each optimizer is wrapped in
  ``hvdlite.torch.DistributedOptimizer`` with ``backward_passes_per_step`` equal to
  ``accumulate_grad_batches``;
- the gradients are averaged at the end of the backward pass that completes a
  step (:meth:`HvdliteStrategy.post_backward`), before Lightning clips them and
  before ``on_before_optimizer_step``: both see the averaged gradients;
- ``reduce``, ``all_gather``, ``broadcast`` and ``barrier`` are hvdlite collectives,
  which is what ``self.log(..., sync_dist=True)``, ``self.all_gather`` and
  Lightning's callbacks (``ModelCheckpoint``, ``EarlyStopping``) call.

Checkpoints are Lightning's own: every rank builds the dictionary, rank 0 writes
the file, and it holds plain ``state_dict()``s that load on any number of ranks,
or without hvdlite.

Cross-rank contract: every rank of the process set builds the Trainer with the
same strategy options and calls the same Trainer methods (``fit``, ``validate``,
...), as with DDP.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch
from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.strategies import ParallelStrategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.model_helpers import is_overridden
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from lightning_utilities.core.rank_zero import rank_zero_only as utils_rank_zero_only

import hvdlite.torch as hvd
from hvdlite import basics
from hvdlite.lightning.collectives import HvdliteCollectives
from hvdlite.lightning.environment import HvdliteEnvironment
from hvdlite.torch.compressors import StatefulCompressor
from hvdlite.torch.grad_hooks import on_grad_accumulated

__all__ = ["HvdliteStrategy"]

#: backward_passes_per_step under manual optimization: the strategy cannot know
#: how many backward passes precede a step there, so the hooks never start a
#: reduction and post_backward() starts them all (see _passes_per_step).
_UNCOUNTED = 2**31 - 1


class HvdliteStrategy(HvdliteCollectives, ParallelStrategy):
    """Data-parallel training on the ranks hvdlite's launcher started.

    ``Trainer(strategy="hvdlite")`` after ``import hvdlite.lightning``, or
    ``Trainer(strategy=HvdliteStrategy(...))`` with options:

    - ``compression``: ``hvd.Compression.fp16`` / ``.bf16`` (a cast, any number of
      optimizers) or a stateful compressor such as ``hvd.Compression.topk(0.01)``
      (one optimizer; for several pass a function that returns a new one);
    - ``shard_optimizer_state``: each rank keeps the optimizer state of its part
      of the parameters only (ZeRO-1/2, as ``DistributedOptimizer`` does);
    - ``process_set``: the hvdlite process set that trains (default: every rank);
      only its members build the Trainer;
    - ``hierarchical_allreduce``: reduce inside each node first
      (``HVDLITE_HIERARCHICAL_ALLREDUCE``; must be chosen before hvdlite starts);
    - ``op``, ``gradient_predivide_factor``, ``bucket_cap_mb``, ``sparse_as_dense``:
      passed to every ``DistributedOptimizer``.

    hvdlite starts here (``hvd.init()``) if the script has not started it yet.
    """

    strategy_name = "hvdlite"

    def __init__(
        self,
        accelerator=None,
        parallel_devices: list[torch.device] | None = None,
        checkpoint_io=None,
        precision_plugin=None,
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
            precision_plugin=precision_plugin,
        )
        self.process_set = process_set
        self._optimizer_options = {
            "op": op,
            "gradient_predivide_factor": gradient_predivide_factor,
            "bucket_cap_mb": bucket_cap_mb,
            "sparse_as_dense": sparse_as_dense,
            "shard_optimizer_state": shard_optimizer_state,
        }
        self._compression = compression
        self._sync_blocked = False
        self._skips = contextlib.ExitStack()  # every optimizer's skip_synchronize()
        self._reached: set[int] = set()  # optimizers this backward pass reached
        self._reach_hooks: list = []
        self._num_nodes = 1
        _check_started_by_launcher()
        rank_zero_only.rank = utils_rank_zero_only.rank = self.global_rank

    # --------------------------------------------------------------- the job

    @property
    def root_device(self) -> torch.device:
        devices = self.parallel_devices
        if devices and devices[0].type != "cpu":
            return devices[self.local_rank % len(devices)]  # ranks may share a GPU
        return torch.device("cpu")

    @property
    def num_nodes(self) -> int:
        return self._num_nodes

    @num_nodes.setter
    def num_nodes(self, num_nodes: int) -> None:
        # Lightning passes Trainer(num_nodes=...); hvdlite's launcher decided already.
        if num_nodes not in (1, hvd.cross_size()):
            raise ValueError(
                f"Trainer(num_nodes={num_nodes}), but hvdlite's launcher started ranks on "
                f"{hvd.cross_size()} node(s): leave num_nodes out (hvdrun -H / the SLURM "
                "allocation decides the nodes)."
            )
        self._num_nodes = num_nodes

    @property
    def is_distributed(self) -> bool:
        return True  # Lightning then gives dataloaders a DistributedSampler

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    @property
    def handles_gradient_accumulation(self) -> bool:
        # Lightning runs the accumulating passes inside block_backward_sync() and
        # steps after the last one; the strategy only needs to know which is which.
        return False

    def setup_environment(self) -> None:
        devices = self.parallel_devices or []
        if len(devices) > 1 and devices[0].type == "cpu" and len(devices) != hvd.local_size():
            raise ValueError(
                f"Trainer(devices={len(devices)}) on CPU asks Lightning to start "
                f"{len(devices)} processes per node, but with hvdlite the launcher starts "
                f"them ({hvd.local_size()} on this node): leave devices out and run "
                f"`hvdrun -np {len(devices)} python ...`."
            )
        super().setup_environment()

    def model_to_device(self) -> None:
        if self.root_device.type == "cuda":
            torch.cuda.set_device(self.root_device)
        assert self.model is not None
        self.model.to(self.root_device)

    # ----------------------------------------------------- setup and teardown

    def setup(self, trainer) -> None:
        super().setup(trainer)  # the module on its device, optimizers, precision
        assert self.lightning_module is not None
        hvd.broadcast_parameters(
            self.lightning_module.state_dict(), root_rank=self._root(), process_set=self.process_set
        )
        if trainer.state.fn != TrainerFn.FITTING:
            return
        automatic = self.lightning_module.automatic_optimization
        passes = trainer.accumulate_grad_batches if automatic else _UNCOUNTED
        self._check_clipping(trainer)
        self.optimizers = self._wrap_optimizers([_unwrap(o) for o in self.optimizers], passes)
        for index, optimizer in enumerate(self.optimizers):
            # post_backward() synchronizes; step() must not reduce again.
            self._skips.enter_context(optimizer.skip_synchronize())
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.requires_grad:
                        self._reach_hooks.append(on_grad_accumulated(p, self._reach(index)))

    def _reach(self, index: int):
        reached = self._reached

        def hook(_):
            reached.add(index)

        return hook

    def _wrap_optimizers(self, optimizers: list, passes: int) -> list:
        if isinstance(self._compression, StatefulCompressor) and len(optimizers) > 1:
            raise ValueError(
                f"compression={type(self._compression).__name__} keeps state for one "
                f"optimizer, and configure_optimizers() returned {len(optimizers)}: pass a "
                "function that builds one per optimizer, e.g. "
                "HvdliteStrategy(compression=lambda: hvd.Compression.topk(0.01))."
            )
        assert self.lightning_module is not None
        named = list(self.lightning_module.named_parameters())
        wrapped = []
        for optimizer in optimizers:
            distributed = wrap_optimizer(
                optimizer,
                named,
                self._compression,
                passes,
                self.process_set,
                self._optimizer_options,
            )
            _retarget_schedulers(self.lr_scheduler_configs, optimizer, distributed)
            wrapped.append(distributed)
        return wrapped

    def _check_clipping(self, trainer) -> None:
        if not self._optimizer_options["shard_optimizer_state"] or not trainer.gradient_clip_val:
            return
        if is_overridden("configure_gradient_clipping", self.lightning_module):
            return
        raise ValueError(
            "Trainer(gradient_clip_val=...) with HvdliteStrategy(shard_optimizer_state=True): "
            "each rank holds only its part of the averaged gradients, which Lightning's "
            "clipping cannot see. Override configure_gradient_clipping(optimizer, ...) to "
            "call optimizer.clip_grad_norm_(max_norm) (one allreduce of the norm) and drop "
            "gradient_clip_val, or drop shard_optimizer_state."
        )

    def teardown(self) -> None:
        self._skips.close()
        for handle in self._reach_hooks:
            handle.remove()
        self._reach_hooks.clear()
        for optimizer in self.optimizers:
            _remove_hooks(_unwrap(optimizer))
        super().teardown()

    # ------------------------------------------------------------- gradients

    @contextlib.contextmanager
    def block_backward_sync(self):
        """Inside, a backward pass only accumulates (gradient accumulation, or
        ``toggle_model(sync_grad=False)`` under manual optimization)."""
        blocked, self._sync_blocked = self._sync_blocked, True
        try:
            yield
        finally:
            self._sync_blocked = blocked

    def pre_backward(self, closure_loss: torch.Tensor) -> None:
        self._reached.clear()

    def post_backward(self, closure_loss: torch.Tensor) -> None:
        """Average the gradients of every optimizer this backward pass reached,
        unless the pass only accumulates (then they wait for the pass that does
        not).  Every rank runs the same passes, so each makes the same choice."""
        if self._sync_blocked:
            return
        for index in sorted(self._reached):
            _unwrap(self.optimizers[index]).synchronize()
        self._reached.clear()

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        # GradientAccumulationScheduler changes accumulate_grad_batches between epochs.
        lm = self.lightning_module
        if lm is None or not lm.automatic_optimization:
            return
        passes = lm.trainer.accumulate_grad_batches
        for optimizer in self.optimizers:
            optimizer = _unwrap(optimizer)
            if getattr(optimizer, "backward_passes_per_step", passes) != passes:
                if not hasattr(optimizer, "set_backward_passes_per_step"):
                    raise ValueError(
                        "accumulate_grad_batches changed during training, which "
                        "shard_optimizer_state=True cannot follow: keep it fixed."
                    )
                optimizer.set_backward_passes_per_step(passes)

    @classmethod
    def register_strategies(cls, strategy_registry) -> None:
        if cls.strategy_name not in strategy_registry:
            strategy_registry.register(
                cls.strategy_name,
                cls,
                description="data-parallel training on hvdlite (MPI): run under hvdrun",
            )


# ------------------------------------------------------------------ helpers


def _start_hvdlite(hierarchical: bool | None) -> None:
    """hvd.init() unless the script did; the hierarchical knob must be set before."""
    knob = "HVDLITE_HIERARCHICAL_ALLREDUCE"
    if hvd.is_initialized():
        running = basics.job_config().hierarchical_allreduce
        if hierarchical is not None and bool(hierarchical) != running:
            raise ValueError(
                f"HvdliteStrategy(hierarchical_allreduce={hierarchical}), but hvdlite was "
                f"started with {knob}={int(running)}: build the strategy before hvd.init(), "
                f"or set {knob} (hvdrun --hierarchical-allreduce) for the whole job."
            )
        return
    if hierarchical is not None:
        os.environ[knob] = "1" if hierarchical else "0"
    hvd.init()


def check_process_set(process_set, strategy: str) -> None:
    """Refuse a set that is not registered, or that this rank is not in."""
    if process_set.included() is None:
        raise ValueError(
            f"{strategy}(process_set={process_set!r}): the set is not registered; "
            "register it first: hvd.init(process_sets=[...]) or hvd.add_process_set(...)."
        )
    if not process_set.included():
        raise ValueError(
            f"this rank ({hvd.rank()}) is not in the process set {process_set.ranks} "
            f"given to {strategy}: build the Trainer or Fabric on the set's ranks only "
            "(`if process_set.included(): ...`)."
        )


def _check_started_by_launcher() -> None:
    """A torchrun-style start (WORLD_SIZE set, each process its own MPI job) gives
    every process a world of one: refuse it rather than train N separate models."""
    declared = os.environ.get("WORLD_SIZE")
    if declared and declared.isdigit() and int(declared) != hvd.size() and hvd.size() == 1:
        raise RuntimeError(
            f"WORLD_SIZE={declared} is set, but MPI started this process alone: "
            "HvdliteStrategy takes its ranks from MPI, so start the job with hvdrun "
            f"(`hvdrun -np {declared} python script.py`), mpiexec or srun, not torchrun "
            "or Lightning's own launcher."
        )


def wrap_optimizer(optimizer, named, compression, passes: int, process_set, options: dict):
    """*optimizer* in a ``DistributedOptimizer`` over its parameters among *named*
    (the module's ``named_parameters()``), rank 0's optimizer state on every rank
    where it has any.  Collective over *process_set*."""
    if hasattr(optimizer, "skip_synchronize"):
        raise ValueError(
            "the optimizer given to the strategy is already an hvdlite DistributedOptimizer; "
            "give the strategy the plain torch optimizer and it wraps it."
        )
    params = {p for group in optimizer.param_groups for p in group["params"]}
    if callable(compression) and not isinstance(compression, type):
        compression = compression()
    distributed = hvd.DistributedOptimizer(
        optimizer,
        named_parameters=[(n, p) for n, p in named if p in params],
        compression=compression,
        backward_passes_per_step=passes,
        process_set=process_set,
        **options,
    )
    # A fresh optimizer has no state yet (broadcasting it would take a step); one
    # that has (restored by the user's code) takes rank 0's.
    root = process_set.ranks[0]
    if hvd.broadcast_object(bool(optimizer.state), root, process_set=process_set):
        hvd.broadcast_optimizer_state(distributed, root_rank=root, process_set=process_set)
    return distributed


def _unwrap(optimizer):
    return optimizer._optimizer if isinstance(optimizer, LightningOptimizer) else optimizer


def _remove_hooks(optimizer) -> None:
    """Take a DistributedOptimizer's gradient hooks off the parameters, so that a
    later fit() (new optimizers over the same parameters) starts clean."""
    for handle in getattr(optimizer, "_hook_handles", ()):
        handle.remove()
    averager = getattr(optimizer, "_averager", None)
    if averager is not None:
        _remove_hooks(averager)


def _retarget_schedulers(configs, original, distributed) -> None:
    """LR schedulers built on *original* step *distributed* (they share param_groups;
    this keeps ``scheduler.optimizer`` pointing at what Lightning steps)."""
    for config in configs:
        if getattr(config.scheduler, "optimizer", None) is original:
            config.scheduler.optimizer = distributed
