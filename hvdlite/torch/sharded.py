"""Sharded optimizer state (ZeRO-1 and -2) behind ``DistributedOptimizer``.

``hvd.DistributedOptimizer(opt, named_parameters=..., shard_optimizer_state=True)``
gives each member of the process set the optimizer state of its part of the
parameters only.  A step:

1. the gradients are averaged and each rank keeps those of its own part (ZeRO-2:
   the parameters' ``.grad`` are dropped);
2. an optimizer of the wrapped class steps that part (its state exists for that
   part only: ZeRO-1);
3. the updated parts are *allgathered* back into every parameter.

Results equal the unsharded optimizer's within floating-point rounding.  Which part
a rank owns is one of two *ownership models*, picked from the optimizer's class:

- element-partitioned (:mod:`.shard_elements`), for the torch optimizers whose update
  is element by element (SGD, Adam, AdamW, ... :data:`ELEMENTWISE_OPTIMIZERS`): every
  gradient bucket is cut into N equal chunks of elements, rank r owns chunk r of
  each, and its optimizer steps 1-D slices that share storage with the parameters.
  Across nodes and on GPUs each bucket's *reduce-scatter* starts from backward as
  soon as its last gradient is ready, overlapping the rest of backward;
- whole-parameter (:mod:`.shard_whole`), for any other optimizer (a class of your
  own, Adafactor, LBFGS...): each rank owns whole parameters, shards balanced by
  bytes; across nodes and on GPUs ``step()`` reduce-scatters one flat buffer per
  dtype after backward.

On one node with CPU tensors the engine reduce-scatters through the node's shared
memory (:mod:`hvdlite.engine.transports.shm_scatter`): a rank sums only its chunk,
and no rank ever holds a full-size reduced gradient, so element ownership saves the
gradients' memory there too.  The whole-parameter model there averages the
gradients during backward instead, in buckets, with an unsharded
``DistributedOptimizer`` over the same parameters (the *averager*), which overlaps
backward where its one flat reduce-scatter after backward could not.

Checkpoints: ``consolidate_state_dict(to=0)`` (collective) gathers the parts' state
on one rank (``to=None``: every rank), whose ``state_dict()`` is then the unsharded
optimizer's ``state_dict()``: loadable by the plain torch optimizer (slices' states
put back together into each parameter's shape).  ``load_state_dict()`` takes such a
consolidated state at any world size.  ``state_dict()`` without a consolidation
first fails, naming the fix (the same contract as torch's
``ZeroRedundancyOptimizer``): a collective hidden in ``state_dict()`` would hang
the usual ``if rank == 0: torch.save(...)``.

Cross-rank contract: every member of the set wraps the same parameters in the
same order (same ``requires_grad``, bucket cap and optimizer class) and calls
``step()``, ``consolidate_state_dict()`` and ``load_state_dict()`` together.
"""

from __future__ import annotations

import contextlib
import inspect
import warnings

import torch

from hvdlite import basics as _basics
from hvdlite.ops import Average, Max, Sum
from hvdlite.process_sets import global_process_set
from hvdlite.torch import mpi_ops as _ops
from hvdlite.torch.buckets import bucket_cap_bytes
from hvdlite.torch.casts import BF16Compressor, FP16Compressor, NoneCompressor
from hvdlite.torch.functions import allgather_object, broadcast_object
from hvdlite.torch.shard_elements import ELEMENTWISE_OPTIMIZERS, ElementShards, is_elementwise
from hvdlite.torch.shard_whole import WholeParameterShards, balanced_shards

__all__ = ["ShardedOptimizer", "balanced_shards", "ELEMENTWISE_OPTIMIZERS"]

_CASTS = (NoneCompressor, FP16Compressor, BF16Compressor)


class ShardedOptimizer(torch.optim.Optimizer):
    """A ``torch.optim.Optimizer`` whose state is sharded over a process set.

    ``param_groups`` are the full groups (an LR scheduler adjusts them as
    usual; each step copies their hyperparameters to the local groups);
    ``state`` stays empty here: this rank's state lives in ``local``, an
    optimizer of the wrapped class over this rank's part (slices of the
    parameters, or whole ones: ``ownership``).
    """

    #: torch.amp.GradScaler then hands step() its scale instead of unscaling the
    #: (absent) gradients of ``param_groups`` itself: step() refuses that, naming
    #: :class:`~hvdlite.torch.sharded_amp.ShardedGradScaler`.
    _step_supports_amp_scaling = True

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        compression=NoneCompressor,
        op=Average,
        gradient_predivide_factor: float = 1.0,
        process_set=None,
        averager=None,
        *,
        names: dict | None = None,
        bucket_cap_mb: float | None = None,
        backward_passes_per_step: int = 1,
    ):
        if not isinstance(compression, type) or not issubclass(compression, _CASTS):
            if not isinstance(compression, _CASTS):
                raise ValueError(
                    "shard_optimizer_state=True supports compression=Compression.none, "
                    ".fp16 or .bf16 (gradients are reduce-scattered as flat buffers); "
                    "top-k and PowerSGD keep per-parameter state: drop shard_optimizer_state "
                    "or the compression."
                )
        if op not in (Average, Sum):
            raise ValueError(
                "shard_optimizer_state=True reduces gradients with op=Average or Sum; "
                f"got {op!r} (Adasum combines whole parameter deltas: use it unsharded)."
            )
        self._process_set = process_set if process_set is not None else global_process_set
        self._compression = compression
        self._op = op
        self._predivide = gradient_predivide_factor
        self._wrapped_class = type(optimizer)
        self._defaults = dict(optimizer.defaults)
        super().__init__(
            [dict(group) for group in optimizer.param_groups], dict(optimizer.defaults)
        )
        self._params = [p for group in self.param_groups for p in group["params"]]
        self._device = self._params[0].device if self._params else torch.device("cpu")
        self._layout_size = None
        self._consolidated = None
        self._skip_reduce = False
        self._synchronized = False
        self._loaded = None
        #: "elements" (each bucket cut into equal chunks) or "parameters" (whole ones)
        self.ownership = "elements" if is_elementwise(optimizer, self._params) else "parameters"
        if self.ownership == "elements":
            if names is None:  # (DistributedOptimizer passes named_parameters' names)
                names = {
                    p: f"allreduce.noname.{g}.{j}"
                    for g, group in enumerate(self.param_groups)
                    for j, p in enumerate(group["params"])
                }
            cap = bucket_cap_bytes(bucket_cap_mb)
            self._model = ElementShards(self, names, cap, backward_passes_per_step)
        else:
            self._model = WholeParameterShards(self)
        # On one node the gradients are averaged during backward (module doc) by an
        # unsharded DistributedOptimizer over an optimizer whose step() does nothing
        # (its hooks, buckets and compression, unchanged), built by *averager*.
        self._make_averager = averager
        self._averager = None
        self._route_whole = None
        self._repartition()
        if optimizer.state:  # an optimizer that already stepped: keep its state, sharded
            self.load_state_dict(optimizer.state_dict())

    # ------------------------------------------------------------- the parts
    def _set_size_and_rank(self) -> tuple[int, int]:
        size, rank = self._process_set.size(), self._process_set.rank()
        if size is None or rank is None:
            raise ValueError(
                "shard_optimizer_state=True: this rank is not a member of the optimizer's "
                "process set; build the optimizer on the set's members only."
            )
        return size, rank

    def _repartition(self) -> None:
        """(Re)build the parts and the local optimizer for the set's current size
        (an elastic job may have changed it; the caller then loads a state)."""
        size, rank = self._set_size_and_rank()
        if self._layout_size == size:
            return
        self._size, self._rank = size, rank
        self._set_route(
            self.ownership == "parameters"
            and self._make_averager is not None
            and self._device.type == "cpu"
            and _basics.allreduce_uses_shared_memory(self._process_set)
        )
        local_groups = self._model.partition(size, rank, self.param_groups)
        accepted = inspect.signature(self._wrapped_class.__init__).parameters
        kwargs = {k: v for k, v in self._defaults.items() if k in accepted}
        self.local = self._wrapped_class(
            [{**_hyper(g), "params": mine} for g, mine in zip(self.param_groups, local_groups)],
            **kwargs,
        )
        self._layout_size = size

    @property
    def _reduce_whole(self) -> bool:
        """Whether the gradients are averaged whole during backward (whole-parameter
        ownership on one node) rather than reduce-scattered; the ownership and the
        engine's routes decide, tests may set it (either route gives the same
        weights)."""
        return self._route_whole

    @_reduce_whole.setter
    def _reduce_whole(self, whole: bool) -> None:
        self._set_route(bool(whole) and self._make_averager is not None)

    def _set_route(self, whole: bool) -> None:
        if whole == self._route_whole:
            return
        self._route_whole = whole
        if whole:
            self._model.stop_hooks()
            self._averager = self._make_averager(_NoStep(self.param_groups))
        else:
            if self._averager is not None:
                for handle in self._averager._hook_handles:
                    handle.remove()
                self._averager = None
            self._model.start_hooks()

    @property
    def _owned(self) -> list[int]:
        """Global indices of the parameters this rank steps (in part or whole)."""
        return sorted({i for i, _, _ in self._model.pieces})

    def _scales(self) -> tuple[float, float, object]:
        """(prescale, postscale, op) of a gradient reduction."""
        if self._op == Average and self._predivide != 1.0:
            return 1.0 / self._predivide, self._predivide / self._size, Sum
        return 1.0, 1.0, self._op

    # -------------------------------------------------------------- the step
    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._model.pending():
            raise AssertionError(
                "optimizer.zero_grad() was called after loss.backward() but before "
                "optimizer.step() or optimizer.synchronize(). This is prohibited as it can "
                "cause a race condition."
            )
        self._model.zero_grad(set_to_none)
        if self._averager is not None:  # it also refuses a zero_grad() after backward
            self._averager.zero_grad(set_to_none=set_to_none)
            return
        for p in self._params:
            if p.grad is not None:
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.detach_()
                    p.grad.zero_()

    def synchronize(self) -> None:
        """Reduce the gradients now: afterwards only this rank's part has a
        gradient (averaged), on the parameters of ``local``; use
        :meth:`skip_synchronize` around the ``step()``."""
        self._repartition()
        self._model.reduce(self._averager)
        self._synchronized = True

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip the reduced gradients by their norm over the whole model (collective
        over the set), as ``torch.nn.utils.clip_grad_norm_`` does unsharded; returns
        that norm.  Call it after :meth:`synchronize` (each rank then holds its part
        of the gradients, on ``local``'s parameters: clipping the model's would see
        none), then ``step()`` inside :meth:`skip_synchronize`."""
        if not self._synchronized:
            raise RuntimeError(
                "clip_grad_norm_() clips the reduced gradients: call optimizer.synchronize() "
                "first, then clip, then step() inside optimizer.skip_synchronize()."
            )
        norm_type = float(norm_type)
        grads = [p.grad for group in self.local.param_groups for p in group["params"]]
        grads = [g for g in grads if g is not None]
        infinite = norm_type == float("inf")
        part = torch.zeros(1, dtype=torch.float64)
        if grads:  # this rank's part of the norm: its max, or its sum of powers
            norms = torch.stack(
                [torch.linalg.vector_norm(g, norm_type, dtype=torch.float64) for g in grads]
            )
            part[0] = (norms.max() if infinite else norms.pow(norm_type).sum()).cpu()
        total = _ops.allreduce(
            part,
            op=Max if infinite else Sum,
            name="sharded.grad_norm",
            process_set=self._process_set,
        )
        norm = total[0] if infinite else total[0] ** (1.0 / norm_type)
        scale = float(max_norm) / (float(norm) + 1e-6)
        if scale < 1.0:
            for g in grads:
                g.mul_(scale)
        return norm.float()

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Inside, ``step()`` does not reduce again (after an explicit synchronize())."""
        self._skip_reduce = True
        try:
            yield
        finally:
            self._skip_reduce = False

    @torch.no_grad()
    def step(self, closure=None):
        if hasattr(self, "found_inf"):  # set by a plain torch.amp.GradScaler
            raise RuntimeError(
                "a torch.amp.GradScaler cannot see a sharded optimizer's gradients (each "
                "rank holds its part, on optimizer.local): use hvdlite.torch.ShardedGradScaler "
                "in its place, with the same arguments."
            )
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._repartition()
        if not self._skip_reduce:
            if self._synchronized:  # reducing twice would lose the gradients
                warnings.warn(
                    "optimizer.step() called without optimizer.skip_synchronize() context "
                    "after optimizer.synchronize(); the gradients were reduced once there.",
                    stacklevel=2,
                )
            else:
                self._model.reduce(self._averager)
        self._synchronized = False
        self._loaded = None
        for full, local in zip(self.param_groups, self.local.param_groups):
            local.update(_hyper(full))
        self.local.step()
        self._model.gather()
        return loss

    # ----------------------------------------------------------- checkpoints
    def consolidate_state_dict(self, to: int | None = 0) -> None:
        """Gather the parts' state (collective over the set) so that ``state_dict()``
        on rank *to* (a global rank; None: on every rank) returns the whole state."""
        self._repartition()
        local = self.local.state_dict()
        locals_ = [p for g in self.local.param_groups for p in g["params"]]
        mine = [
            (*self._model.pieces[li], tuple(locals_[li].shape), _to_cpu(state))
            for li, state in local["state"].items()
        ]
        parts = allgather_object(mine, name="sharded.consolidate", process_set=self._process_set)
        if to is None or _basics.rank() == to:
            state = _assemble([piece for part in parts for piece in part], self._params)
            groups, index = [], 0
            for group in self.param_groups:
                n = len(group["params"])
                groups.append({**_hyper(group), "params": list(range(index, index + n))})
                index += n
            self._consolidated = {"state": state, "param_groups": groups}
        else:
            self._consolidated = None

    def state_dict(self) -> dict:
        if self._consolidated is None:
            raise RuntimeError(
                "this optimizer's state is sharded over the ranks: call "
                "optimizer.consolidate_state_dict(to=rank) on every rank first, then "
                "state_dict() on that rank (to=None: on every rank)."
            )
        consolidated, self._consolidated = self._consolidated, None
        return consolidated

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a consolidated (unsharded) state, saved at any number of ranks."""
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups) or any(
            len(g["params"]) != len(mine["params"]) for g, mine in zip(groups, self.param_groups)
        ):
            raise ValueError(
                "load_state_dict: the state's parameter groups do not match this "
                "optimizer's (a different model or parameter order?)"
            )
        self._repartition()
        for mine, saved in zip(self.param_groups, groups):
            mine.update(_hyper(saved))
        keys = [key for g in groups for key in g["params"]]
        state, local_state, local_groups, li = state_dict["state"], {}, [], 0
        for group, local in zip(groups, self.local.param_groups):
            ids = []
            for piece in local["params"]:
                i, first, end = self._model.pieces[li]
                if keys[i] in state:
                    saved_state, p = state[keys[i]], self._params[i]
                    local_state[li] = _slice_state(saved_state, p, first, end, piece)
                ids.append(li)
                li += 1
            local_groups.append({**_hyper(group), "params": ids})
        self.local.load_state_dict({"state": local_state, "param_groups": local_groups})
        self._loaded = state_dict  # the whole state, until the next step (broadcast_state)

    def broadcast_state(self, root_rank: int) -> None:
        """Every rank takes *root_rank*'s state and hyperparameters (collective).

        Where *root_rank* loaded a whole state and has not stepped since (Horovod's
        ``if rank == 0: opt.load_state_dict(...)`` then a broadcast; an elastic
        restore), that state is what every rank takes; otherwise the ranks' parts,
        consolidated on *root_rank*."""
        root = _basics.rank() == root_rank
        state = self._loaded if root else None
        if not broadcast_object(
            state is not None, root_rank, name="sharded.loaded", process_set=self._process_set
        ):
            self.consolidate_state_dict(to=root_rank)
            state = self._consolidated if root else None
            self._consolidated = None
        state = broadcast_object(
            state, root_rank, name="sharded.broadcast", process_set=self._process_set
        )
        self.load_state_dict(state)

    def __repr__(self) -> str:
        mine = sum(end - first for _, first, end in self._model.pieces)
        total = sum(p.numel() for p in self._params)
        return (
            f"ShardedOptimizer({self._wrapped_class.__name__}, owning {self.ownership}: "
            f"part {self._rank} of {self._size}, {mine} of {total} elements)"
        )


def _assemble(pieces, params) -> dict:
    """The unsharded state of each parameter from its pieces' states (global index,
    first, end, the local parameter's shape, state): a tensor shaped like the local
    parameter is that piece's part of a tensor shaped like the parameter, any other
    value (a step count, a scalar) is the same in every piece.  A parameter whose
    pieces do not cover it (only some ranks loaded a state) gets none."""
    by_param: dict = {}
    for i, first, end, shape, state in pieces:
        by_param.setdefault(i, []).append((first, end, shape, state))
    out = {}
    for i in sorted(by_param):
        parts = sorted(by_param[i], key=lambda part: part[0])
        p, covered = params[i], 0
        for first, end, _, _ in parts:
            covered = end if first == covered else -1
        if covered != p.numel():
            continue
        whole = {}
        for key, value in parts[0][3].items():
            if all(
                torch.is_tensor(part[3].get(key)) and tuple(part[3][key].shape) == part[2]
                for part in parts
            ):
                flat = [part[3][key].reshape(-1) for part in parts]
                whole[key] = (flat[0] if len(flat) == 1 else torch.cat(flat)).reshape(p.shape)
            else:
                whole[key] = value
        out[i] = whole
    return out


def _slice_state(state: dict, p: torch.Tensor, first: int, end: int, piece) -> dict:
    """The part of a parameter's unsharded *state* for its elements first..end (the
    local parameter *piece*): tensors shaped like the parameter are cut, the rest
    kept."""
    if piece is p:
        return state
    return {
        k: v.reshape(-1)[first:end].reshape(piece.shape).clone()
        if torch.is_tensor(v) and v.shape == p.shape
        else v
        for k, v in state.items()
    }


class _NoStep(torch.optim.Optimizer):
    """The parameters of a ShardedOptimizer, for its gradient averager: this
    optimizer's step() changes nothing (the shard's optimizer steps)."""

    def __init__(self, param_groups):
        super().__init__([{"params": list(g["params"])} for g in param_groups], {})

    def step(self, closure=None):
        return None


def _hyper(group: dict) -> dict:
    return {k: v for k, v in group.items() if k != "params"}


def _to_cpu(state: dict) -> dict:
    return {k: v.cpu() if torch.is_tensor(v) else v for k, v in state.items()}
