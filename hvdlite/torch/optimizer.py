"""DistributedOptimizer: average gradients across ranks while backward runs.

``DistributedOptimizer(opt, ...)`` returns an optimizer that is still an
instance of ``type(opt)`` (a subclass created once per optimizer class, with
:class:`_DistributedOptimizer` first in its MRO) sharing ``opt``'s parameter
groups and state.  A hook on every parameter starts that gradient's in-place
allreduce the moment autograd has accumulated it, so communication overlaps
the rest of backward; ``step()`` (or ``synchronize()``) waits for them and
writes the averaged gradients back before the wrapped optimizer's own step.

Cross-rank contract: every rank of ``process_set`` wraps the same parameters
under the same names (``named_parameters``; otherwise names follow the order
of the parameter groups) and calls ``step()``/``synchronize()`` the same
number of times.  Gradients may become ready in any order on each rank: the
engine matches them by name.

Three ways to reduce, chosen by the arguments:

- default (Average/Sum/Min/Max, optionally with a stateless ``compression``
  cast): one allreduce per gradient (or group) started from the hook;
- a stateful ``compression`` (``Compression.topk(ratio)``,
  ``Compression.powersgd(...)``): the hooks only count backward passes;
  ``synchronize()`` hands every gradient to the compressor at once, which
  runs its own grouped exchange (no overlap with backward: the grouped
  exchange needs all gradients, and one collective per phase beats one per
  tensor).  Its state is part of ``state_dict()``;
- ``op=Adasum``: the delta-optimizer scheme.  Gradients stay local; ``step()``
  remembers the parameters, runs the wrapped optimizer's step on this rank's
  gradients, and combines the parameter deltas of all ranks with Adasum
  (one grouped allreduce), so every rank ends with ``start + adasum(deltas)``.

``optimizer.bytes_sent_last_step`` is the payload this rank handed to the
engine in the last step (allreduce inputs, or allgathered values and indices).
"""

from __future__ import annotations

import contextlib
import os
import warnings
import weakref
from collections import Counter

import torch

import hvdlite as _engine
from hvdlite import Adasum, Average, Sum, global_process_set
from hvdlite._subclass import with_mixin
from hvdlite.torch.adasum_optimizer import adasum_delta_step
from hvdlite.torch.compression import Compression
from hvdlite.torch.compressors import STATE_KEY, StatefulCompressor
from hvdlite.torch.mpi_ops import (
    allreduce_async_,
    grouped_allreduce_async_,
    sparse_allreduce_async,
    synchronize,
)

__all__ = ["DistributedOptimizer"]

_SPARSE = object()  # ctx marker: the gradient went through sparse_allreduce_async


class _DistributedOptimizer:
    """The methods a wrapped optimizer gains (mixed in before its own class)."""

    # ---------------------------------------------------------------- setup

    def _hvd_setup(self, named_parameters, compression, backward_passes_per_step, op,
                   gradient_predivide_factor, groups, sparse_as_dense, process_set):
        self._compression = compression
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        self._parameter_names = _name_parameters(self.param_groups, named_parameters)
        self._p_to_group = _parameter_groups(groups, self.param_groups)
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {p: backward_passes_per_step for p in self._parameter_names}
        self._handles: dict = {}       # parameter or group -> (handle or None, ctx)
        self._group_ready: dict = {}   # group -> parameters whose gradient is final
        self._requires_update: set = set()
        self._keys: list = []          # every parameter or group that gets reduced
        self._key_ids: set = set()
        self._hook_handles: list = []
        self._synchronized = False
        self._should_synchronize = True
        # topk/powersgd reduce at synchronize(), Adasum combines deltas in step():
        # either way the hooks only count backward passes.
        self._stateful = isinstance(compression, StatefulCompressor)
        self._deferred = self._stateful or op == Adasum
        self._adasum_start: dict = {}  # Adasum: parameter -> its value before the step
        self.bytes_sent_last_step = 0
        self._bytes_pending = 0
        elastic = os.environ.get("HVDLITE_ELASTIC", os.environ.get("HOROVOD_ELASTIC")) == "1"
        self._hooks_on = process_set.included() and (process_set.size() > 1 or elastic)
        if self._hooks_on:
            self._register_hooks()

    def _register_hooks(self) -> None:
        ref = weakref.ref(self)

        def grad_ready(p):  # a dropped optimizer leaves harmless no-op hooks behind
            opt = ref()
            if opt is not None:
                opt._grad_ready(p)

        for group in self.param_groups:
            for p in group["params"]:
                if not p.requires_grad or p in self._requires_update:
                    continue
                self._requires_update.add(p)
                self._hook_handles.append(_on_grad_accumulated(p, grad_ready))
                key = self._p_to_group.get(p, p)
                if id(key) not in self._key_ids:
                    self._key_ids.add(id(key))
                    self._keys.append(key)

    # -------------------------------------------------------- the hook path

    def _grad_ready(self, p) -> None:
        """Autograd has accumulated p's gradient for this backward pass."""
        if self._allreduce_delay[p] <= 0:
            raise AssertionError(
                "Gradients were computed more than backward_passes_per_step times before "
                "call to step(). Increase backward_passes_per_step to accumulate gradients "
                "locally.")
        if p.grad is not None and p.grad.requires_grad:
            raise AssertionError("DistributedOptimizer does not support gradients that "
                                 "require grad (backward(create_graph=True))")
        self._allreduce_delay[p] -= 1
        group = self._p_to_group.get(p)
        key = p if group is None else group
        if self._allreduce_delay[p] > 0 or self._deferred:  # mark pending only
            self._handles.setdefault(key, (None, None))
            return
        if group is None:
            self._handles[p] = self._submit(p)
            return
        ready = self._group_ready.setdefault(group, set())
        ready.add(p)
        if len(ready) == len(group):
            del self._group_ready[group]
            self._handles[group] = self._submit_group(group)
        else:
            self._handles.setdefault(group, (None, None))

    def _scale_factors(self) -> tuple[float, float]:
        if self.op == Average:  # the engine divides by the set's size for Average
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

    def _wire_tensor(self, p):
        """The tensor that carries p's gradient: p.grad itself when possible."""
        if p.grad is None:  # not computed on this rank: contribute zeros
            p.grad = torch.zeros_like(p)
        grad = p.grad
        dense = grad.to_dense() if grad.is_sparse else grad
        wire, ctx = self._compression.compress(dense)
        return (wire if wire.is_contiguous() else wire.contiguous()), ctx

    def _submit(self, p):
        name = self._parameter_names[p]
        if p.grad is not None and p.grad.is_sparse and not self.sparse_as_dense:
            grad = p.grad.coalesce()
            self._bytes_pending += grad.values().nbytes + grad.indices().nbytes
            return sparse_allreduce_async(grad, name=name, op=self.op,
                                          process_set=self.process_set), _SPARSE
        wire, ctx = self._wire_tensor(p)
        self._bytes_pending += wire.nbytes
        pre, post = self._scale_factors()
        handle = allreduce_async_(wire, name=name, op=self.op, prescale_factor=pre,
                                  postscale_factor=post, process_set=self.process_set)
        return handle, (wire, ctx)

    def _submit_group(self, group):
        wires = [self._wire_tensor(p) for p in group]
        self._bytes_pending += sum(w.nbytes for w, _ in wires)
        pre, post = self._scale_factors()
        handle = grouped_allreduce_async_(
            [w for w, _ in wires], name=self._parameter_names[group[0]], op=self.op,
            prescale_factor=pre, postscale_factor=post, process_set=self.process_set)
        return handle, wires

    def _write_back(self, p, ctx) -> None:
        wire, cctx = ctx
        grad = p.grad
        if wire is grad:  # reduced in place
            return
        result = self._compression.decompress(wire, cctx)
        if grad.is_sparse:  # sparse_as_dense: the optimizer expects a sparse gradient
            p.grad = result.to_sparse()
        else:
            grad.copy_(result)

    def _finish_allreduces(self) -> None:
        """Start what backward did not (unused parameters, incomplete groups),
        wait for every allreduce and write the results to ``.grad``."""
        for key in self._keys:
            if self._handles.get(key, (None, None))[0] is None:
                self._handles[key] = (self._submit_group(key) if isinstance(key, tuple)
                                      else self._submit(key))
        for key, (handle, ctx) in self._handles.items():
            if ctx is _SPARSE:
                key.grad = synchronize(handle).coalesce()
                continue
            synchronize(handle)
            if isinstance(key, tuple):
                for p, member_ctx in zip(key, ctx, strict=True):
                    self._write_back(p, member_ctx)
            else:
                self._write_back(key, ctx)

    # ------------------------------- deferred paths: stateful compression, Adasum

    def _reduce_stateful(self) -> None:
        """Hand every gradient (zeros where none was computed) to the stateful
        compressor, in the parameters' order, which is the same on every rank."""
        grads, sparse = [], []
        for p, name in self._parameter_names.items():
            if p not in self._requires_update:
                continue
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grad = p.grad
            if grad.is_sparse:
                grad = grad.to_dense()
                sparse.append((p, grad))
            grads.append((name, grad))
        self._bytes_pending += self._compression.reduce(grads, self.process_set, self.op)
        for p, dense in sparse:
            p.grad = dense.to_sparse()

    # ------------------------------------------------------------ public API

    def synchronize(self) -> None:
        """Wait for every gradient's allreduce (starting those backward did not:
        unused parameters, incomplete groups) and write the results to ``.grad``.

        With a stateful compression this is where the whole exchange runs; with
        op=Adasum it only closes the backward passes (gradients stay local,
        ``step()`` combines the parameter deltas)."""
        if not self._hooks_on:
            self._synchronized = True
            return
        try:
            if self._stateful:
                self._reduce_stateful()
            elif not self._deferred:  # Adasum: nothing to do before step()
                self._finish_allreduces()
        finally:
            self._handles.clear()
            self._group_ready.clear()
            for p in self._allreduce_delay:
                self._allreduce_delay[p] = self.backward_passes_per_step
            self.bytes_sent_last_step, self._bytes_pending = self._bytes_pending, 0
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
                    "optimizer.synchronize() in your code.", stacklevel=2)
            self.synchronize()
        self._synchronized = False
        if self.op == Adasum and self._hooks_on:
            return adasum_delta_step(self, super().step, closure)
        return super().step() if closure is None else super().step(closure)

    # torch wraps a class's step() for its profiler and step hooks unless it is
    # marked hooked; the wrapped optimizer's own step() is, so hooks run once.
    step.hooked = True

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise AssertionError(
                "optimizer.zero_grad() was called after loss.backward() but before "
                "optimizer.step() or optimizer.synchronize(). This is prohibited as it can "
                "cause a race condition.")
        return super().zero_grad(*args, **kwargs)

    def state_dict(self):
        """The wrapped optimizer's state dict, plus a stateful compressor's
        state (residuals, PowerSGD's Q) under ``"hvdlite_compression"`` (a
        plain optimizer ignores that key when loading)."""
        state = super().state_dict()
        if self._stateful:
            state[STATE_KEY] = self._compression.state_dict()
        return state

    def load_state_dict(self, state_dict) -> None:
        compression_state = None
        if isinstance(state_dict, dict) and STATE_KEY in state_dict:
            state_dict = dict(state_dict)
            compression_state = state_dict.pop(STATE_KEY)
        super().load_state_dict(state_dict)
        if compression_state is not None and self.__dict__.get("_stateful"):
            self._compression.load_state_dict(compression_state)

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Change how many backward passes accumulate locally before an allreduce."""
        _check_passes(passes)
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    def add_param_group(self, param_group) -> None:
        super().add_param_group(param_group)
        if "_parameter_names" not in self.__dict__:  # called while being built
            return
        index = len(self.param_groups) - 1
        for j, p in enumerate(self.param_groups[-1]["params"]):
            self._parameter_names.setdefault(p, f"allreduce.noname.{index}.{j}")
            self._allreduce_delay.setdefault(p, self.backward_passes_per_step)
        if self._hooks_on:
            self._register_hooks()


# ------------------------------------------------------------------ helpers


def _on_grad_accumulated(p, hook):
    """Call hook(p) each time autograd has accumulated a gradient into p.grad."""
    if hasattr(p, "register_post_accumulate_grad_hook"):  # torch >= 2.1
        return p.register_post_accumulate_grad_hook(hook)
    accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
    handle = accumulator.register_hook(lambda *_: hook(p))
    handle.accumulator = accumulator  # keep the node alive with its hook
    return handle


def _name_parameters(param_groups, named_parameters) -> dict:
    """Map every optimized parameter to its allreduce name (validated)."""
    params = [(i, j, p) for i, g in enumerate(param_groups) for j, p in enumerate(g["params"])]
    if named_parameters is None:
        return {p: f"allreduce.noname.{i}.{j}" for i, j, p in params}
    named = list(named_parameters)
    if not all(isinstance(x, tuple) and len(x) == 2 for x in named):
        raise ValueError("named_parameters should be a sequence of tuples (name, parameter), "
                         "usually produced by model.named_parameters().")
    dups = sorted(n for n, count in Counter(n for n, _ in named).items() if count > 1)
    if dups:
        raise ValueError("Parameter names in named_parameters must be unique. "
                         f"Found duplicates: {', '.join(map(str, dups))}")
    names: dict = {}
    for name, p in named:
        names.setdefault(p, str(name))
    missing = [f"param_groups[{i}]['params'][{j}] (shape {tuple(p.shape)})"
               for i, j, p in params if p not in names]
    if missing:
        raise ValueError("named_parameters was specified, but one or more model parameters "
                         f"were not named: {', '.join(missing)}. Pass the named_parameters() "
                         "of the model(s) that own every parameter given to the optimizer.")
    return {p: names[p] for _, _, p in params}


def _parameter_groups(groups, param_groups) -> dict:
    """Map each parameter in a reduction group of 2+ to that group (a tuple)."""
    if groups is None or (isinstance(groups, int) and not isinstance(groups, bool)
                          and groups == 0):
        return {}
    params = [p for g in param_groups for p in g["params"] if p.requires_grad]
    if isinstance(groups, int) and not isinstance(groups, bool):
        if groups < 0:
            raise ValueError(f"groups should be a non-negative integer or a list of lists of "
                             f"torch.Tensor, got {groups}")
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
                    raise ValueError("groups must consist of torch.Tensor, got "
                                     f"{type(p).__name__}")
                if id(p) in seen:
                    raise ValueError("A parameter can only appear once in groups.")
                if id(p) not in known:
                    raise ValueError("groups contains a tensor that is not a trainable "
                                     "parameter of this optimizer")
                seen.add(id(p))
            chunks.append(chunk)
    else:
        raise ValueError("groups should be a non-negative integer or a list of lists of "
                         f"torch.Tensor, got {type(groups).__name__}")
    mapping = {}
    for chunk in chunks:
        if len(chunk) > 1:
            members = tuple(chunk)
            for p in members:
                mapping[p] = members
    return mapping


def _check_compression(compression, op) -> None:
    if compression in (Compression.topk, Compression.powersgd):
        raise ValueError(f"compression=Compression.{compression.__name__} must be called to "
                         f"build a compressor, e.g. Compression.topk(0.01) or "
                         f"Compression.powersgd(rank=4)")
    if isinstance(compression, StatefulCompressor) and op not in (Average, Sum):
        raise ValueError(f"{compression!r} reduces gradients by op=Average or op=Sum, got "
                         f"op={op!r}; use Compression.none/fp16/bf16 with other ops")


def _check_passes(passes) -> None:
    if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
        raise ValueError(f"backward_passes_per_step must be a positive integer, got {passes!r}")


def _distributed_class(base: type) -> type:
    """``base`` with the distributed methods in front; named like ``base``."""
    return with_mixin(_DistributedOptimizer, base, __name__)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average,
                         gradient_predivide_factor=1.0, num_groups=0, groups=None,
                         sparse_as_dense=False, process_set=global_process_set):
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
    dense tensors.  The result is still an instance of ``type(optimizer)`` and
    shares its parameter groups and state.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError("hvdlite.torch.DistributedOptimizer wraps a torch.optim.Optimizer, "
                        f"got {type(optimizer).__name__}")
    if isinstance(optimizer, _DistributedOptimizer):
        raise ValueError("this optimizer is already a DistributedOptimizer; wrap the "
                         "original optimizer only once")
    _engine.size()  # ValueError naming the fix when init() has not been called
    _check_passes(backward_passes_per_step)
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    set_size = process_set.size()
    if op == Adasum and set_size and set_size & (set_size - 1):
        raise ValueError(f"op=Adasum needs a power-of-two number of ranks, the process set "
                         f"has {set_size}; use op=Average or run on 2, 4, 8... ranks")
    if gradient_predivide_factor <= 0:
        raise ValueError(f"gradient_predivide_factor must be positive, "
                         f"got {gradient_predivide_factor}")
    _check_compression(compression, op)
    if num_groups:
        warnings.warn("Parameter `num_groups` has been replaced by `groups`.",
                      DeprecationWarning, stacklevel=2)
        if groups is None:
            groups = num_groups
    cls = _distributed_class(type(optimizer))
    distributed = cls.__new__(cls)
    # Share everything but methods an LR scheduler may have bound to the original.
    distributed.__dict__.update(
        {k: v for k, v in optimizer.__dict__.items() if k not in ("step", "zero_grad")})
    distributed._hvd_setup(named_parameters, compression, backward_passes_per_step, op,
                           gradient_predivide_factor, groups, sparse_as_dense, process_set)
    return distributed
