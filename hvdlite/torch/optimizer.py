"""DistributedOptimizer: average gradients across ranks while backward runs.

``DistributedOptimizer(opt, ...)`` returns an optimizer that is still an
instance of ``type(opt)`` (a subclass created once per optimizer class, with
:class:`_DistributedOptimizer` first in its MRO) sharing ``opt``'s parameter
groups and state.  A hook on every parameter tells the optimizer when autograd
has accumulated that gradient; once it is final (``backward_passes_per_step``
passes, every member of its group) the optimizer hands it to its *reducer*,
and ``step()`` (or ``synchronize()``) asks the reducer to finish before the
wrapped optimizer's own step.

Where handing a gradient over early buys nothing, the hooks only count passes
and the reducer starts everything at ``synchronize()`` (:func:`_hooks_start_work`):
for a reducer whose ``gradient_ready`` does nothing, and for the default
allreduce of CPU gradients where no rank's engine thread has a core of its own
(``HVDLITE_OVERLAP``; agreed at ``init()``).  There the reductions would share
the cores backward is computing on, and starting them later costs less.

The reducer (:mod:`.reducers`) is picked once, when the optimizer is built:

- default (Average/Sum/Min/Max, optionally with a stateless ``compression``
  cast): :class:`~.reducers.AllreduceReducer`, one grouped allreduce per
  gradient bucket (:mod:`.buckets`; or per ``groups`` group, or per gradient
  with ``bucket_cap_mb=0``) started from the hook once the bucket's last
  gradient is final, so communication overlaps backward;
- a stateful ``compression`` (``Compression.topk(ratio)``,
  ``Compression.powersgd(...)``): :class:`~.reducers.CompressorReducer`,
  the compressor's grouped exchange at ``synchronize()``; its state is part
  of ``state_dict()``;
- ``op=Adasum``: :class:`~.reducers.AdasumReducer`, the delta-optimizer
  scheme (gradients stay local, ``step()`` combines parameter deltas);
- ``reducer=``: any :class:`~.reducers.GradientReducer` of your own.

Cross-rank contract: every rank of ``process_set`` wraps the same parameters
under the same names (``named_parameters``; otherwise names follow the order
of the parameter groups), with the same reducer, and calls
``step()``/``synchronize()`` the same number of times.  Gradients may become
ready in any order on each rank: the engine matches them by name.

On rank 0, while a timeline is written, each step draws its backward pass
(from the first gradient a hook saw to ``synchronize()``) and its
``synchronize()`` on the timeline's steps track (:mod:`hvdlite.timeline.steps`).

``optimizer.bytes_sent_last_step`` is the payload this rank handed to the
engine in the last step (allreduce inputs, or allgathered values and indices),
as counted by the reducer.
"""

from __future__ import annotations

import contextlib
import gc
import os
import warnings
import weakref
from collections import Counter

import torch

from hvdlite import basics as _basics
from hvdlite.ops import Adasum, Average
from hvdlite.process_sets import global_process_set
from hvdlite.timeline.steps import StepSpans
from hvdlite._subclass import with_mixin
from hvdlite.torch.buckets import FIRST_BUCKET_BYTES, bucket_cap_bytes, build_buckets
from hvdlite.torch.compression import Compression
from hvdlite.torch.compressors import STATE_KEY, StatefulCompressor
from hvdlite.torch.grad_hooks import check_no_graph as _check_no_graph
from hvdlite.torch.grad_hooks import on_grad_accumulated as _on_grad_accumulated
from hvdlite.torch.reducers import (
    AdasumReducer,
    AllreduceReducer,
    CompressorReducer,
    GradientReducer,
    ReductionContext,
    check_predivide,
)

__all__ = ["DistributedOptimizer"]


class _DistributedOptimizer:
    """The methods a wrapped optimizer gains (mixed in before its own class)."""

    # ---------------------------------------------------------------- setup

    def _hvd_setup(
        self,
        named_parameters,
        reducer,
        compression,
        backward_passes_per_step,
        op,
        gradient_predivide_factor,
        groups,
        sparse_as_dense,
        process_set,
        bucket_cap: int,
    ):
        # Horovod's attributes, kept for code that reads them:
        self._compression = compression
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        self._parameter_names = _name_parameters(self.param_groups, named_parameters)
        self._hooks_start = _hooks_start_work(reducer, self.param_groups)
        self._p_to_group = _parameter_groups(groups, self.param_groups)
        if groups is None and isinstance(reducer, AllreduceReducer):
            self._p_to_group = _bucket_groups(
                self.param_groups, bucket_cap, small_first=self._hooks_start
            )
        self.backward_passes_per_step = backward_passes_per_step
        self._reducer = reducer
        self._reduction = ReductionContext(self._parameter_names, process_set)
        # Hook state, one small record per hooked parameter and per key (a
        # parameter, group or bucket), so the hook never looks a tensor up in a
        # dict: hashing a tensor is a Python call, and a tuple key hashes every
        # member.
        self._slots: list[_Slot] = []
        self._units: list[_Unit] = []
        self._hooked: list[torch.Tensor] = []  # the parameters of _slots, in order
        self._hook_handles: list = []
        self._synchronized = False
        self._should_synchronize = True
        self._spans = StepSpans()  # the step's backward and synchronize, on rank 0's timeline
        elastic = os.environ.get("HVDLITE_ELASTIC", os.environ.get("HOROVOD_ELASTIC")) == "1"
        self._hooks_on = process_set.included() and (process_set.size() > 1 or elastic)
        if self._hooks_on:
            _refuse_second_wrapper(self._optimizer_step_pre_hooks)
            self._register_hooks()
            self.register_step_pre_hook(_step_guard(weakref.ref(self)))

    def _register_hooks(self) -> None:
        ref = weakref.ref(self)
        keys = self._reduction.keys
        units = {id(keys[u.index]): u for u in self._units}
        for group in self.param_groups:
            for p in group["params"]:
                key = self._p_to_group.get(p, p)
                if not (p.requires_grad and self._reduction._track(p, key)):
                    continue
                unit = units.get(id(key))
                if unit is None:  # _track has just appended key to keys
                    size = len(key) if isinstance(key, tuple) else 1
                    unit = units[id(key)] = _Unit(len(keys) - 1, size)
                    self._units.append(unit)
                slot = _Slot(unit, self.backward_passes_per_step)
                self._slots.append(slot)
                self._hooked.append(p)
                if self._hooks_start:
                    hook = _hook(ref, slot)
                else:
                    hook = _counting_hook(ref, slot, self._spans)
                self._hook_handles.append(_on_grad_accumulated(p, hook))

    # -------------------------------------------------------- the hook path

    def _grad_ready(self, p, slot: _Slot) -> None:
        """Autograd has accumulated p's gradient for this backward pass."""
        if self._spans.idle:
            self._spans.backward_began()
        left = slot.left
        if left <= 0:
            raise AssertionError(
                "Gradients were computed more than backward_passes_per_step times before "
                "call to step(). Increase backward_passes_per_step to accumulate gradients "
                "locally."
            )
        _check_no_graph(p.grad)
        slot.left = left - 1
        if left > 1:
            return
        unit = slot.unit
        unit.left -= 1
        if unit.left == 0:
            self._reducer.gradient_ready(self._reduction, self._reduction.keys[unit.index])

    def _backward_pending(self) -> bool:
        """Whether autograd accumulated a gradient since the last synchronize()."""
        passes = self.backward_passes_per_step
        return any(slot.left != passes for slot in self._slots)

    def _check_counted_gradients(self) -> None:
        """Where the hooks only count: the check the starting hook makes on each
        gradient, made on one this step accumulated (create_graph covers them all)."""
        passes = self.backward_passes_per_step
        for p, slot in zip(self._hooked, self._slots, strict=True):
            if slot.left != passes:
                _check_no_graph(p.grad)
                return

    def _reset_hooks(self) -> None:
        """Every parameter waits for backward_passes_per_step passes again."""
        passes = self.backward_passes_per_step
        for slot in self._slots:
            slot.left = passes
        for unit in self._units:
            unit.left = unit.size

    @property
    def _allreduce_delay(self) -> dict:
        """Horovod's attribute (read only here): passes each hooked parameter
        still waits for before its gradient is final."""
        return {p: slot.left for p, slot in zip(self._hooked, self._slots, strict=True)}

    # ------------------------------------------------------------ public API

    @property
    def bytes_sent_last_step(self) -> int:
        """Payload bytes this rank handed to the engine in the last step."""
        return self._reducer.bytes_sent_last_step

    def synchronize(self) -> None:
        """Have the reducer finish every gradient's reduction and write the
        results to ``.grad`` (starting those backward did not: unused
        parameters, incomplete groups).

        With a stateful compression this is where the whole exchange runs; with
        op=Adasum it only closes the backward passes (gradients stay local,
        ``step()`` combines the parameter deltas)."""
        if not self._hooks_on:
            self._synchronized = True
            return
        spans = self._spans
        spans.synchronize_began()
        try:
            if not self._hooks_start:
                self._check_counted_gradients()
            self._reducer.synchronize(self._reduction)
        finally:
            self._reset_hooks()
            spans.synchronize_ended()
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Make ``step()`` skip its synchronize (use after calling it yourself)::

        optimizer.synchronize()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        with optimizer.skip_synchronize():
            optimizer.step()
        """
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn(
                    "optimizer.step() called without optimizer.skip_synchronize() context "
                    "after optimizer.synchronize(). This can cause training slowdown. You may "
                    "want to consider using optimizer.skip_synchronize() context if you use "
                    "optimizer.synchronize() in your code.",
                    stacklevel=2,
                )
            self.synchronize()
        self._synchronized = False
        if self._hooks_on:
            return self._reducer.step(self._reduction, super().step, closure)
        return super().step() if closure is None else super().step(closure)

    # torch wraps a class's step() for its profiler and step hooks unless it is
    # marked hooked; the wrapped optimizer's own step() is, so hooks run once.
    step.hooked = True

    def zero_grad(self, *args, **kwargs):
        if self._hooks_on and self._backward_pending():
            raise AssertionError(
                "optimizer.zero_grad() was called after loss.backward() but before "
                "optimizer.step() or optimizer.synchronize(). This is prohibited as it can "
                "cause a race condition."
            )
        return super().zero_grad(*args, **kwargs)

    def state_dict(self):
        """The wrapped optimizer's state dict, plus the reducer's state (a
        stateful compressor's residuals, PowerSGD's Q) under
        ``"hvdlite_compression"`` (a plain optimizer ignores that key when
        loading)."""
        state = super().state_dict()
        reducer_state = self._reducer.state_dict()
        if reducer_state is not None:
            state[STATE_KEY] = reducer_state
        return state

    def load_state_dict(self, state_dict) -> None:
        reducer_state = None
        if isinstance(state_dict, dict) and STATE_KEY in state_dict:
            state_dict = dict(state_dict)
            reducer_state = state_dict.pop(STATE_KEY)
        super().load_state_dict(state_dict)
        reducer = self.__dict__.get("_reducer")
        if reducer_state is not None and reducer is not None:
            reducer.load_state_dict(reducer_state)

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Change how many backward passes accumulate locally before an allreduce."""
        _check_passes(passes)
        self.backward_passes_per_step = passes
        self._reset_hooks()

    def add_param_group(self, param_group) -> None:
        super().add_param_group(param_group)
        if "_parameter_names" not in self.__dict__:  # called while being built
            return
        index = len(self.param_groups) - 1
        for j, p in enumerate(self.param_groups[-1]["params"]):
            self._parameter_names.setdefault(p, f"allreduce.noname.{index}.{j}")
        if self._hooks_on:
            self._register_hooks()


# ------------------------------------------------------------------ helpers


class _Unit:
    """A key of the reduction (a parameter, or a group or bucket of them), by
    its index in ``ReductionContext.keys``, and how many of its members'
    gradients are still to become final this step."""

    __slots__ = ("index", "size", "left")

    def __init__(self, index: int, size: int):
        self.index = index
        self.size = size
        self.left = size


class _Slot:
    """One hooked parameter: backward passes left before its gradient is final,
    and the unit it belongs to.  Holds no tensor (its hook is on the tensor)."""

    __slots__ = ("unit", "left")

    def __init__(self, unit: _Unit, passes: int):
        self.unit = unit
        self.left = passes


def _hook(ref, slot: _Slot):
    """The post-accumulate-grad hook of one parameter; a dropped optimizer
    leaves a harmless no-op behind."""

    def grad_ready(p):
        opt = ref()
        if opt is not None:
            opt._grad_ready(p, slot)

    return grad_ready


def _counting_hook(ref, slot: _Slot, spans: StepSpans):
    """The hook where the reducer starts nothing during backward: counts the pass
    (and notes the step's first gradient for the timeline) and, only past the
    last allowed one, lets the optimizer raise."""

    def grad_accumulated(p):
        if spans.idle:
            spans.backward_began()
        left = slot.left
        if left > 0:
            slot.left = left - 1
            return
        opt = ref()
        if opt is not None:
            opt._grad_ready(p, slot)  # raises: more passes than backward_passes_per_step

    return grad_accumulated


# The wrapper shares the wrapped optimizer's step hooks (the same dict), so a hook
# it registers runs whichever of them steps: :func:`_step_guard` tells a step of
# the wrapper from one that bypassed it.
_BYPASSED_STEP = (
    "step() was called on the optimizer that hvd.DistributedOptimizer wrapped, not on the "
    "optimizer it returned: the gradients of this backward pass were not averaged across "
    "ranks. Call step() and zero_grad() on what DistributedOptimizer returned, e.g. "
    "optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=...)."
)
_WRAPPED_TWICE = (
    "this optimizer is already wrapped by another hvd.DistributedOptimizer (the same "
    "torch optimizer passed twice, perhaps once through hvdlite.DistributedOptimizer and "
    "once through hvdlite.torch.DistributedOptimizer): both would hook the same parameters, "
    "and a step of one leaves the other's gradients counted but never reduced. Wrap the "
    "torch optimizer once and use only the optimizer that call returned."
)


def _step_guard(ref):
    """A step pre-hook: refuses a step of another optimizer object (the wrapped one,
    or a second wrapper of it) while this wrapper's gradients wait to be reduced."""

    def guard(optimizer, args, kwargs):
        wrapper = ref()
        if wrapper is None or optimizer is wrapper or not wrapper._backward_pending():
            return None
        if isinstance(optimizer, _DistributedOptimizer):
            raise RuntimeError(_WRAPPED_TWICE)
        raise RuntimeError(_BYPASSED_STEP)

    guard.hvdlite_wrapper = ref
    return guard


def _refuse_second_wrapper(step_hooks) -> None:
    """ValueError when a live wrapper with hooks already shares these step hooks (the
    same torch optimizer wrapped before).  A wrapper that is only waiting for the
    garbage collector (an LR scheduler makes a cycle) does not count."""

    def others():
        return [
            hook.hvdlite_wrapper()
            for hook in list(step_hooks.values())
            if getattr(hook, "hvdlite_wrapper", None) is not None
        ]

    if any(w is not None and w._hooks_on for w in others()):
        gc.collect()
        if any(w is not None and w._hooks_on for w in others()):
            raise ValueError(_WRAPPED_TWICE)


def _hooks_start_work(reducer: GradientReducer, param_groups) -> bool:
    """Whether the hooks hand each final gradient to *reducer* during backward
    (else they only count passes, and ``synchronize()`` starts every reduction).

    Not for a reducer whose ``gradient_ready`` does nothing, nor for the default
    allreduce of CPU gradients where no rank's engine thread has a core of its
    own: there the reductions would run on the cores backward computes on, and
    starting them all at ``synchronize()`` costs less (``bench_torch_models.py``
    measures the step).  A reducer of your own that overrides ``gradient_ready``
    is always called."""
    ready = type(reducer).gradient_ready
    if ready is GradientReducer.gradient_ready:
        return False
    if ready is not AllreduceReducer.gradient_ready:
        return True
    if _basics.reductions_overlap_compute():
        return True
    return any(p.device.type != "cpu" for group in param_groups for p in group["params"])


def _name_parameters(param_groups, named_parameters) -> dict:
    """Map every optimized parameter to its allreduce name (validated)."""
    params = [(i, j, p) for i, g in enumerate(param_groups) for j, p in enumerate(g["params"])]
    if named_parameters is None:
        return {p: f"allreduce.noname.{i}.{j}" for i, j, p in params}
    named = list(named_parameters)
    if not all(isinstance(x, tuple) and len(x) == 2 for x in named):
        raise ValueError(
            "named_parameters should be a sequence of tuples (name, parameter), "
            "usually produced by model.named_parameters()."
        )
    dups = sorted(n for n, count in Counter(n for n, _ in named).items() if count > 1)
    if dups:
        raise ValueError(
            "Parameter names in named_parameters must be unique. "
            f"Found duplicates: {', '.join(map(str, dups))}"
        )
    names: dict = {}
    for name, p in named:
        names.setdefault(p, str(name))
    missing = [
        f"param_groups[{i}]['params'][{j}] (shape {tuple(p.shape)})"
        for i, j, p in params
        if p not in names
    ]
    if missing:
        raise ValueError(
            "named_parameters was specified, but one or more model parameters "
            f"were not named: {', '.join(missing)}. Pass the named_parameters() "
            "of the model(s) that own every parameter given to the optimizer."
        )
    return {p: names[p] for _, _, p in params}


def _parameter_groups(groups, param_groups) -> dict:
    """Map each parameter in a reduction group of 2+ to that group (a tuple)."""
    if groups is None or (isinstance(groups, int) and not isinstance(groups, bool) and groups == 0):
        return {}
    params = [p for g in param_groups for p in g["params"] if p.requires_grad]
    if isinstance(groups, int) and not isinstance(groups, bool):
        if groups < 0:
            raise ValueError(
                f"groups should be a non-negative integer or a list of lists of "
                f"torch.Tensor, got {groups}"
            )
        count = min(groups, len(params))
        size, extra = divmod(len(params), count) if count else (0, 0)
        chunks, start = [], 0
        for k in range(count):
            end = start + size + (1 if k < extra else 0)
            chunks.append(params[start:end])
            start = end
    elif isinstance(groups, (list, tuple)):
        known = {id(p) for p in params}
        seen: set = set()
        chunks = []
        for chunk in groups:
            chunk = list(chunk)
            for p in chunk:
                if not isinstance(p, torch.Tensor):
                    raise ValueError(f"groups must consist of torch.Tensor, got {type(p).__name__}")
                if id(p) in seen:
                    raise ValueError("A parameter can only appear once in groups.")
                if id(p) not in known:
                    raise ValueError(
                        "groups contains a tensor that is not a trainable "
                        "parameter of this optimizer"
                    )
                seen.add(id(p))
            chunks.append(chunk)
    else:
        raise ValueError(
            "groups should be a non-negative integer or a list of lists of "
            f"torch.Tensor, got {type(groups).__name__}"
        )
    mapping = {}
    for chunk in chunks:
        if len(chunk) > 1:
            members = tuple(chunk)
            for p in members:
                mapping[p] = members
    return mapping


def _bucket_groups(param_groups, cap: int, small_first: bool) -> dict:
    """Map each parameter in a gradient bucket of 2+ to that bucket (a tuple).
    *small_first*: the reductions start during backward, so the first bucket
    is kept small (see :mod:`.buckets`)."""
    params = [p for g in param_groups for p in g["params"] if p.requires_grad]
    first = FIRST_BUCKET_BYTES if small_first else cap
    return {p: bucket for bucket in build_buckets(params, cap, first) for p in bucket}


def _check_compression(compression) -> None:
    if compression in (Compression.topk, Compression.powersgd):
        raise ValueError(
            f"compression=Compression.{compression.__name__} must be called to "
            f"build a compressor, e.g. Compression.topk(0.01) or "
            f"Compression.powersgd(rank=4)"
        )


def _check_passes(passes) -> None:
    if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
        raise ValueError(f"backward_passes_per_step must be a positive integer, got {passes!r}")


def _check_reducer(reducer, compression, op, gradient_predivide_factor, sparse_as_dense) -> None:
    """A reducer given by the user decides how gradients are reduced: the
    arguments that would pick or configure a built-in one must stay default."""
    if not isinstance(reducer, GradientReducer):
        raise TypeError(
            f"reducer must be a hvdlite.torch.GradientReducer (subclass it and "
            f"implement synchronize(ctx)), got {type(reducer).__name__}"
        )
    conflicts = []
    if compression is not Compression.none:
        cast = [
            f"Compression.{n}" for n in ("fp16", "bf16") if getattr(Compression, n) is compression
        ]
        conflicts.append(f"compression={cast[0] if cast else repr(compression)}")
    if op != Average:
        conflicts.append(f"op={getattr(op, 'name', str(op)).title()}")
    if gradient_predivide_factor != 1.0:
        conflicts.append(f"gradient_predivide_factor={gradient_predivide_factor}")
    if sparse_as_dense:
        conflicts.append("sparse_as_dense=True")
    if conflicts:
        raise ValueError(
            f"reducer={type(reducer).__name__}(...) decides how gradients are reduced and "
            f"cannot be combined with {', '.join(conflicts)}; pass those to a reducer instead "
            f"(AllreduceReducer(op=..., compression=..., gradient_predivide_factor=..., "
            f"sparse_as_dense=...), CompressorReducer(Compression.topk(0.01)), "
            f"AdasumReducer()) or leave reducer=None"
        )


def _default_reducer(
    compression, op, gradient_predivide_factor, sparse_as_dense
) -> GradientReducer:
    """The reducer Horovod's arguments describe."""
    if isinstance(compression, StatefulCompressor):
        return CompressorReducer(compression, op)
    if op == Adasum:
        return AdasumReducer(compression)
    return AllreduceReducer(op, compression, gradient_predivide_factor, sparse_as_dense)


def _distributed_class(base: type) -> type:
    """``base`` with the distributed methods in front; named like ``base``."""
    return with_mixin(_DistributedOptimizer, base, __name__)


def DistributedOptimizer(
    optimizer,
    named_parameters=None,
    compression=Compression.none,
    backward_passes_per_step=1,
    op=Average,
    gradient_predivide_factor=1.0,
    num_groups=0,
    groups=None,
    sparse_as_dense=False,
    process_set=global_process_set,
    *,
    reducer: GradientReducer | None = None,
    bucket_cap_mb: float | None = None,
    shard_optimizer_state: bool = False,
):
    """Wrap a ``torch.optim.Optimizer`` so that ``step()`` applies gradients
    averaged (``op``) over every rank of ``process_set``.

    Arguments follow Horovod: ``named_parameters`` (usually
    ``model.named_parameters()``) names each allreduce; ``compression``
    (``Compression.none``, ``.fp16``, ``.bf16``) casts gradients for the wire,
    (+) ``Compression.topk(ratio)`` and ``Compression.powersgd(rank,
    start_step)`` compress them with error feedback (a new one per
    optimizer; their state is part of ``state_dict()``); ``op=Adasum``
    combines the parameter deltas of local steps (power-of-two set sizes);
    ``backward_passes_per_step`` accumulates that many backward passes locally
    before reducing; ``gradient_predivide_factor`` f divides gradients by f
    before the sum and by size/f after (Average only; no effect on topk and
    powersgd, which reduce in float32 or wider); ``groups`` (an int, or
    lists of parameters) reduces parameters in fused groups (``num_groups`` is
    its deprecated spelling); ``sparse_as_dense`` reduces sparse gradients as
    dense tensors.  (+) ``bucket_cap_mb``: unless ``groups`` is given,
    gradients are reduced in buckets of about this many MB, one grouped
    allreduce each, last layers first (:mod:`.buckets`; default
    ``HVDLITE_BUCKET_CAP_MB`` or 25; 0 reduces each gradient on its own, as
    Horovod does; the results are the same).  (+) ``reducer``, a
    :class:`~.reducers.GradientReducer`, replaces the reduction those
    arguments pick (``compression``, ``op``, ``gradient_predivide_factor``
    and ``sparse_as_dense`` must then stay default; one reducer per
    optimizer).  The result is still an instance of
    ``type(optimizer)`` and shares its parameter groups and state.
    (+) ``shard_optimizer_state=True`` keeps on each rank the optimizer state of
    its part of the parameters only, reduce-scattering gradients and
    allgathering the updated parameters (:mod:`.sharded`: ZeRO-1/2; checkpoints
    through ``consolidate_state_dict()``): for SGD, Adam, AdamW and the other
    element-wise torch optimizers each gradient bucket's reduce-scatter starts
    during backward (on one node: its allreduce), for any other optimizer whole
    parameters are reduce-scattered in ``step()`` (on one node: allreduced in
    backward); ``named_parameters``, ``backward_passes_per_step`` and
    ``bucket_cap_mb`` apply, ``groups`` has no effect, ``reducer``, top-k,
    PowerSGD and Adasum are refused.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            "hvdlite.torch.DistributedOptimizer wraps a torch.optim.Optimizer, "
            f"got {type(optimizer).__name__}"
        )
    if isinstance(optimizer, _DistributedOptimizer):
        raise ValueError(
            "this optimizer is already a DistributedOptimizer; wrap the "
            "original optimizer only once"
        )
    _basics.size()  # ValueError naming the fix when init() has not been called
    _check_passes(backward_passes_per_step)
    if shard_optimizer_state:
        if reducer is not None or sparse_as_dense:
            raise ValueError(
                "shard_optimizer_state=True reduce-scatters dense gradients itself: "
                "drop reducer= and sparse_as_dense=, or the sharding."
            )
        check_predivide(op, gradient_predivide_factor)
        from hvdlite.torch.sharded import ShardedOptimizer

        if named_parameters is not None:  # read twice: by the averager and the sharding
            named_parameters = list(named_parameters)

        def averager(no_step_optimizer):  # gradients averaged during backward, on one node
            return DistributedOptimizer(
                no_step_optimizer,
                named_parameters=named_parameters,
                compression=compression,
                backward_passes_per_step=backward_passes_per_step,
                op=op,
                gradient_predivide_factor=gradient_predivide_factor,
                process_set=process_set,
                bucket_cap_mb=bucket_cap_mb,
            )

        return ShardedOptimizer(
            optimizer,
            compression,
            op,
            gradient_predivide_factor,
            process_set,
            averager=averager,
            names=_name_parameters(optimizer.param_groups, named_parameters),
            bucket_cap_mb=bucket_cap_mb,
            backward_passes_per_step=backward_passes_per_step,
        )
    bucket_cap = bucket_cap_bytes(bucket_cap_mb)
    if reducer is not None:
        _check_reducer(reducer, compression, op, gradient_predivide_factor, sparse_as_dense)
    check_predivide(op, gradient_predivide_factor)
    set_size = process_set.size()
    if (
        (op == Adasum or isinstance(reducer, AdasumReducer))
        and set_size
        and set_size & (set_size - 1)
    ):
        raise ValueError(
            f"op=Adasum needs a power-of-two number of ranks, the process set "
            f"has {set_size}; use op=Average or run on 2, 4, 8... ranks"
        )
    if reducer is None:
        _check_compression(compression)
        reducer = _default_reducer(compression, op, gradient_predivide_factor, sparse_as_dense)
    if num_groups:
        warnings.warn(
            "Parameter `num_groups` has been replaced by `groups`.",
            DeprecationWarning,
            stacklevel=2,
        )
        if groups is None:
            groups = num_groups
    cls = _distributed_class(type(optimizer))
    distributed = cls.__new__(cls)
    # Share everything but methods an LR scheduler may have bound to the original.
    distributed.__dict__.update(
        {k: v for k, v in optimizer.__dict__.items() if k not in ("step", "zero_grad")}
    )
    distributed._hvd_setup(
        named_parameters,
        reducer,
        compression,
        backward_passes_per_step,
        op,
        gradient_predivide_factor,
        groups,
        sparse_as_dense,
        process_set,
        bucket_cap,
    )
    return distributed
