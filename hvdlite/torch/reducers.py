"""Gradient reducers: how a DistributedOptimizer turns local gradients into reduced ones.

A :class:`~hvdlite.torch.DistributedOptimizer` owns the bookkeeping every
scheme shares (parameter names, hooks, ``backward_passes_per_step``, groups,
the ``synchronize``/``step`` protocol) and hands the reduction itself to one
*reducer*, picked when it is built, much as PyTorch DDP hands each bucket to a
communication hook.  Three come with hvdlite, chosen from Horovod's arguments:

- :class:`AllreduceReducer` (the default; ``op``, a stateless ``compression``
  cast, ``gradient_predivide_factor``, ``sparse_as_dense``): one allreduce per
  key (a bucket of gradients, a group, or one gradient; sparse gradients keep
  their own exchange), started from the hook while backward still runs where
  the engine thread has a core of its own, else at ``synchronize()``;
- :class:`CompressorReducer` (``compression=Compression.topk(...)`` or
  ``Compression.powersgd(...)``): the whole exchange at ``synchronize()``;
- :class:`AdasumReducer` (``op=Adasum``): gradients stay local, ``step()``
  combines the parameter deltas (:mod:`.adasum_optimizer`).

Your own scheme is a subclass of :class:`GradientReducer` passed as
``DistributedOptimizer(opt, reducer=...)``.  This one sums every gradient in
one grouped allreduce and divides by the number of ranks (run it with
``hvdrun -np 2 python example.py``)::

    import torch
    import hvdlite.torch as hvd

    class SumThenDivide(hvd.GradientReducer):
        def synchronize(self, ctx):
            named = ctx.named_gradients()  # same names, same order on every rank
            grads = [grad for _, grad in named]
            hvd.grouped_allreduce_(grads, name=f"sum_then_divide.{named[0][0]}",
                                   op=hvd.Sum, process_set=ctx.process_set)
            for grad in grads:
                grad.div_(ctx.process_set.size())

    hvd.init()
    model = torch.nn.Linear(4, 2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   reducer=SumThenDivide())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    model(torch.randn(8, 4)).sum().backward()
    opt.step()

Cross-rank contract: every rank of the optimizer's process set uses a reducer
of the same class, built with the same arguments, on the same named
parameters, and the reducer runs the same collectives in the same order on
every rank (the hook order differs between ranks; ``ctx.keys`` and
``ctx.parameters()`` do not).  A reducer instance serves one optimizer.
"""

from __future__ import annotations

import torch

from hvdlite.collectives import waiting_caller
from hvdlite.ops import Average, Sum
from hvdlite.torch.adasum_optimizer import adasum_delta_step
from hvdlite.torch.casts import BF16Compressor, FP16Compressor, NoneCompressor
from hvdlite.torch.compression import Compression
from hvdlite.torch.compressors import StatefulCompressor
from hvdlite.torch.mpi_ops import (
    allreduce_async_,
    grouped_allreduce_async_,
    sparse_allreduce_async,
    synchronize,
)

__all__ = [
    "GradientReducer",
    "ReductionContext",
    "AllreduceReducer",
    "CompressorReducer",
    "AdasumReducer",
]


def _grad_or_zeros(p: torch.Tensor) -> torch.Tensor:
    """p.grad, first set to zeros when this rank computed none (every rank
    must contribute a tensor to each collective)."""
    if p.grad is None:
        p.grad = torch.zeros_like(p)
    return p.grad


class ReductionContext:
    """What a DistributedOptimizer tells its reducer; one object per optimizer,
    passed to every reducer call.

    - ``names``: every parameter of the optimizer mapped to its name (from
      ``named_parameters``, else ``allreduce.noname.<group>.<index>``); grows
      with ``add_param_group``.
    - ``process_set``: the set the gradients are reduced over.
    - ``keys``: the units of reduction, each a parameter or, for the
      optimizer's ``groups``, a tuple of parameters; the same list in the same
      order on every rank.
    """

    def __init__(self, names: dict, process_set):
        self.names = names
        self.process_set = process_set
        self.keys: list = []
        self._reduced: set = set()  # parameters with a hook
        self._key_ids: set = set()

    def parameters(self) -> list[torch.Tensor]:
        """Every parameter whose gradient is reduced (those that required grad
        when the optimizer was built), in the optimizer's order."""
        return [p for p in self.names if p in self._reduced]

    def named_gradients(self) -> list[tuple[str, torch.Tensor]]:
        """``(name, p.grad)`` for each of :meth:`parameters`, a gradient this
        rank did not compute set to zeros first.  Writing the reduced values
        into these tensors (in place) is what a reducer's ``synchronize`` does."""
        return [(self.names[p], _grad_or_zeros(p)) for p in self.parameters()]

    def _track(self, p: torch.Tensor, key) -> bool:
        """Record that p is reduced as part of *key* (p or p's group); False
        when p is already tracked.  Called by the optimizer only."""
        if p in self._reduced:
            return False
        self._reduced.add(p)
        if id(key) not in self._key_ids:
            self._key_ids.add(id(key))
            self.keys.append(key)
        return True


class GradientReducer:
    """Base class of reduction strategies; override :meth:`synchronize` at least.

    The optimizer calls these on every rank of its process set, and only when
    there is something to reduce (the set has two or more ranks, or the job
    is elastic): on one rank the gradients are already final.

    - :meth:`gradient_ready` during backward, when a key's gradient is final
      (after ``backward_passes_per_step`` passes; for a group, when all of its
      members are); each key at most once per step, in an order that differs
      between ranks;
    - :meth:`synchronize` from ``optimizer.synchronize()`` (and ``step()``):
      reduce every key of ``ctx.keys``, including those ``gradient_ready`` never
      saw (parameters this rank did not use, incomplete groups), and leave the
      results in ``.grad``;
    - :meth:`step` in place of the wrapped optimizer's step;
    - :meth:`state_dict`/:meth:`load_state_dict` with the optimizer's own
      (saved under ``"hvdlite_compression"``).

    ``bytes_sent_last_step`` (read as ``optimizer.bytes_sent_last_step``) is
    the payload this rank handed to the engine in the last step, where the
    reducer counts it (0 otherwise).
    """

    bytes_sent_last_step: int = 0

    def gradient_ready(self, ctx: ReductionContext, key) -> None:
        """*key*'s gradient (a parameter, or a tuple of parameters) is final
        on this rank; a reducer may start its reduction now.  Default: nothing."""

    def synchronize(self, ctx: ReductionContext) -> None:
        """Finish the reduction of every key in ``ctx.keys`` and write the
        results into the parameters' ``.grad``."""
        raise NotImplementedError(f"{type(self).__name__} must implement synchronize(ctx)")

    def step(self, ctx: ReductionContext, base_step, closure=None):
        """Run the wrapped optimizer's step (*base_step*) and return its
        result; a reducer that combines updates rather than gradients
        (Adasum) wraps it.  Default: ``base_step(closure)``."""
        return base_step() if closure is None else base_step(closure)

    def state_dict(self) -> dict | None:
        """State to save with the optimizer, or None (default) for none."""
        return None

    def load_state_dict(self, state) -> None:
        """Restore what :meth:`state_dict` returned.  Default: ignore it."""


# ------------------------------------------------------------------ allreduce


def check_predivide(op, gradient_predivide_factor) -> None:
    """Horovod's rule: a predivide factor only with op=Average, and positive."""
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if gradient_predivide_factor <= 0:
        raise ValueError(
            f"gradient_predivide_factor must be positive, got {gradient_predivide_factor}"
        )


def _check_stateless(compression, use_instead: str) -> None:
    if isinstance(compression, StatefulCompressor):
        raise ValueError(f"{compression!r} keeps state across steps; {use_instead}")


class _DenseAllreduce:
    """An in-flight allreduce of one gradient or one group: the handle and,
    per member, (parameter, tensor on the wire, compression context)."""

    __slots__ = ("handle", "members")

    def __init__(self, handle, members: list):
        self.handle = handle
        self.members = members

    def finish(self, compression) -> None:
        synchronize(self.handle)
        for p, wire, cctx in self.members:
            grad = p.grad
            if wire is grad:  # reduced in place
                continue
            result = compression.decompress(wire, cctx)
            if grad.is_sparse:  # sparse_as_dense: the optimizer expects a sparse gradient
                p.grad = result.to_sparse()
            else:
                grad.copy_(result)


def _flatten(tensors: list[torch.Tensor]) -> torch.Tensor:
    """One new 1-D tensor holding *tensors* one after the other (one C++ call)."""
    return torch._utils._flatten_dense_tensors(tensors)


def _unflatten_into(tensors: list[torch.Tensor], flat: torch.Tensor) -> None:
    """Copy the consecutive pieces of *flat* back into *tensors* (one call each way)."""
    pieces = torch._utils._unflatten_dense_tensors(flat, tensors)
    torch._foreach_copy_(tensors, pieces)


#: Gradients of a bucket smaller than this are packed into its flat tensor; larger
#: ones are reduced where they are, in the same grouped allreduce.  Packing saves
#: the engine a few microseconds per array but costs two copies of the data,
#: which for a gradient this big costs more than it saves.
PACK_BELOW_BYTES = 32 << 10


class _BucketBuffer:
    """How a bucket's gradients travel: the small ones packed into one flat
    tensor kept from step to step (with its pieces as views shaped like those
    gradients, so packing is one copy into the views and unpacking one copy out
    of them, with no tensor made per step), the large ones as they are.  Valid
    for gradients of the dtype and device it was made for, while the large ones
    stay contiguous.

    Cross-rank contract: which gradients are packed follows only from their
    sizes and layout, so every rank sends the same arrays in the same order."""

    __slots__ = ("packed", "apart", "flat", "views", "dtype", "device")

    def __init__(self, grads: list[torch.Tensor]):
        packed, apart = [], []
        for i, grad in enumerate(grads):
            small = grad.numel() * grad.element_size() < PACK_BELOW_BYTES
            (packed if small or not grad.is_contiguous() else apart).append(i)
        if len(packed) == 1 and grads[packed[0]].is_contiguous():
            apart, packed = sorted(apart + packed), []  # one small array needs no packing
        self.packed, self.apart = packed, apart
        self.flat = _flatten([grads[i] for i in packed]) if packed else None
        self.views = (
            list(torch._utils._unflatten_dense_tensors(self.flat, [grads[i] for i in packed]))
            if packed
            else []
        )
        self.dtype = grads[0].dtype
        self.device = grads[0].device

    def fits(self, grads: list[torch.Tensor]) -> bool:
        return (
            grads[0].dtype == self.dtype
            and grads[0].device == self.device
            and all(grads[i].is_contiguous() for i in self.apart)
        )

    def pack(self, grads: list[torch.Tensor]) -> list[torch.Tensor]:
        """The arrays to reduce: the flat tensor (if any) first, then the large
        gradients themselves."""
        if not self.packed:
            return [grads[i] for i in self.apart]
        torch._foreach_copy_(self.views, [grads[i] for i in self.packed])
        return [self.flat] + [grads[i] for i in self.apart]

    def unpack_into(self, grads: list[torch.Tensor], reduced: torch.Tensor) -> None:
        """The packed gradients from *reduced*: the flat tensor reduced in place,
        or a tensor a cast gave back."""
        packed = [grads[i] for i in self.packed]
        if reduced is self.flat:
            torch._foreach_copy_(packed, self.views)
        else:
            _unflatten_into(packed, reduced)


class _CastBucket:
    """How a bucket travels under a cast to 16 bits (``Compression.fp16`` or
    ``.bf16``): every gradient cast into its piece of one flat tensor of the wire
    dtype, kept from step to step, so the cast is the packing and the engine
    reduces one array in place; afterwards each piece is widened straight back
    into its gradient.  The same values as casting each gradient alone (a cast
    acts element by element), without a tensor made per gradient and step, or
    the engine's copies into and out of its fusion buffer.  Valid for gradients
    of the dtype, device and sizes it was made for.

    Cross-rank contract: the layout follows only from the gradients' sizes, in
    the bucket's order, the same on every rank."""

    __slots__ = ("flat", "views", "dtype", "device", "numels")

    def __init__(self, grads: list[torch.Tensor], wire_dtype: torch.dtype):
        self.numels = [grad.numel() for grad in grads]
        self.flat = torch.empty(sum(self.numels), dtype=wire_dtype, device=grads[0].device)
        self.views = [
            piece.view(grad.shape)
            for piece, grad in zip(self.flat.split(self.numels), grads, strict=True)
        ]
        self.dtype = grads[0].dtype
        self.device = grads[0].device

    def fits(self, grads: list[torch.Tensor]) -> bool:
        return (
            grads[0].dtype == self.dtype
            and grads[0].device == self.device
            and [grad.numel() for grad in grads] == self.numels
        )

    def pack(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """The flat wire tensor, holding *grads* cast to its dtype."""
        torch._foreach_copy_(self.views, grads)
        return self.flat

    def unpack_into(self, grads: list[torch.Tensor]) -> None:
        """The reduced pieces widened back into *grads*."""
        torch._foreach_copy_(grads, self.views)


class _CastBucketAllreduce:
    """An in-flight allreduce of a bucket's :class:`_CastBucket`."""

    __slots__ = ("handle", "grads", "bucket")

    def __init__(self, handle, grads: list, bucket: _CastBucket):
        self.handle = handle
        self.grads = grads
        self.bucket = bucket

    def finish(self, compression) -> None:
        synchronize(self.handle)
        self.bucket.unpack_into(self.grads)


class _BucketAllreduce:
    """An in-flight grouped allreduce of a bucket as its :class:`_BucketBuffer`
    sends it: one engine entry, with one array for all small gradients.  *grads*
    are the gradients it was made from; *wires* the arrays on the wire, with
    their compression contexts, in the order the buffer gave them."""

    __slots__ = ("handle", "grads", "buffer", "wires")

    def __init__(self, handle, grads: list, buffer: _BucketBuffer, wires: list):
        self.handle = handle
        self.grads = grads
        self.buffer = buffer
        self.wires = wires

    def finish(self, compression) -> None:
        synchronize(self.handle)
        wires = iter(self.wires)
        if self.buffer.packed:
            wire, cctx = next(wires)
            self.buffer.unpack_into(self.grads, compression.decompress(wire, cctx))
        for i, (wire, cctx) in zip(self.buffer.apart, wires, strict=True):
            grad = self.grads[i]
            if wire is not grad:  # a cast: reduced in a copy
                grad.copy_(compression.decompress(wire, cctx))


class _SparseAllreduce:
    """An in-flight sparse allreduce (allgather of values and indices) of p's gradient."""

    __slots__ = ("handle", "param")

    def __init__(self, handle, param: torch.Tensor):
        self.handle = handle
        self.param = param

    def finish(self, compression) -> None:
        self.param.grad = synchronize(self.handle).coalesce()


class _Several:
    """The in-flight reductions of one group whose members travel apart."""

    __slots__ = ("records",)

    def __init__(self, records: list):
        self.records = records

    def finish(self, compression) -> None:
        for record in self.records:
            record.finish(compression)


#: Casts that act element by element: casting a flat bucket casts each member
#: as casting it alone would, so a bucket may travel flat under them.
_ELEMENTWISE = (NoneCompressor, FP16Compressor, BF16Compressor)
#: The casts to 16 bits, whose buckets travel as one flat tensor of the wire dtype
_CASTS = (FP16Compressor, BF16Compressor)


class AllreduceReducer(GradientReducer):
    """The default: one grouped allreduce (``op``) per key -- a bucket of about
    ``bucket_cap_mb`` (25) MB of gradients, a ``groups=`` group, or one gradient
    with ``bucket_cap_mb=0`` as Horovod does -- started from backward once the
    key's last gradient is final where the engine thread has a core of its own
    (communication overlaps the rest of backward), else all at ``synchronize()``
    (see :func:`hvdlite.torch.optimizer._hooks_start_work`).

    ``compression`` is a stateless cast for the wire (``Compression.none``,
    ``.fp16``, ``.bf16``); ``gradient_predivide_factor`` f divides by f before
    the sum and by size/f after (op=Average only); sparse gradients go through
    ``sparse_allreduce_async`` unless ``sparse_as_dense``.
    """

    def __init__(
        self,
        op=Average,
        compression=Compression.none,
        gradient_predivide_factor: float = 1.0,
        sparse_as_dense: bool = False,
    ):
        check_predivide(op, gradient_predivide_factor)
        _check_stateless(compression, f"use CompressorReducer({compression!r})")
        self.op = op
        self.compression = compression
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self._in_flight: dict = {}  # id(key) -> _DenseAllreduce or _SparseAllreduce
        self._buffers: dict = {}  # id(bucket) -> its _BucketBuffer or _CastBucket
        self._bytes_pending = 0

    def gradient_ready(self, ctx, key) -> None:
        self._in_flight[id(key)] = self._start(ctx, key)

    def synchronize(self, ctx) -> None:
        """Start what backward did not, wait for everything, write back."""
        try:
            with waiting_caller():  # waited on right below, by this thread
                for key in ctx.keys:
                    if id(key) not in self._in_flight:
                        self._in_flight[id(key)] = self._start(ctx, key)
            for record in self._in_flight.values():
                record.finish(self.compression)
        finally:
            self._in_flight.clear()
            self.bytes_sent_last_step, self._bytes_pending = self._bytes_pending, 0

    def _scale_factors(self) -> tuple[float, float]:
        if self.op == Average:  # the engine divides by the set's size for Average
            factor = self.gradient_predivide_factor
            return 1.0 / factor, factor
        return 1.0, 1.0

    def _wire(self, p):
        """(tensor carrying p's gradient, compression context): p.grad itself when possible."""
        grad = _grad_or_zeros(p)
        dense = grad.to_dense() if grad.is_sparse else grad
        wire, cctx = self.compression.compress(dense)
        return (wire if wire.is_contiguous() else wire.contiguous()), cctx

    def _sparse(self, p) -> bool:
        return p.grad is not None and p.grad.is_sparse and not self.sparse_as_dense

    def _start(self, ctx, key):
        if isinstance(key, tuple):
            bucket = self._start_bucket(ctx, key, keep=True)
            if bucket is not None:  # the common case: no per-member checks below
                return bucket
            # Sparse gradients in a group (or bucket) keep their own exchange.
            sparse = [p for p in key if self._sparse(p)]
            dense = [p for p in key if not self._sparse(p)] if sparse else key
            records = [self._start(ctx, p) for p in sparse]
            if len(dense) == 1:
                records.append(self._start(ctx, dense[0]))
            elif dense:
                records.append(self._start_group(ctx, dense))
            return records[0] if len(records) == 1 else _Several(records)
        p, name = key, ctx.names[key]
        if self._sparse(p):
            grad = p.grad.coalesce()
            self._bytes_pending += grad.values().nbytes + grad.indices().nbytes
            return _SparseAllreduce(
                sparse_allreduce_async(grad, name=name, op=self.op, process_set=ctx.process_set), p
            )
        pre, post = self._scale_factors()
        wire, cctx = self._wire(p)
        self._bytes_pending += wire.nbytes
        handle = allreduce_async_(
            wire,
            name=name,
            op=self.op,
            prescale_factor=pre,
            postscale_factor=post,
            process_set=ctx.process_set,
        )
        return _DenseAllreduce(handle, [(p, wire, cctx)])

    def _start_bucket(self, ctx, params, keep: bool = False):
        """One (grouped) allreduce of *params*' gradients, the small ones packed
        into one flat tensor (:class:`_BucketBuffer`), named after the first;
        None where the class says it cannot.  *keep*: *params* is a key of
        ``ctx.keys``, whose buffer is kept for the next step."""
        if self.compression not in _ELEMENTWISE:
            return None
        dtype = _grad_or_zeros(params[0]).dtype
        grads = []
        for p in params:
            grad = p.grad
            if grad is None:
                grad = _grad_or_zeros(p)
            if grad.dtype is not dtype or grad.layout is not torch.strided:
                return None
            grads.append(grad)
        pre, post = self._scale_factors()
        if self.compression in _CASTS and self.compression.should_cast(dtype):
            return self._start_cast_bucket(ctx, params, grads, keep, pre, post)
        buffer = self._buffers.get(id(params)) if keep else None
        if buffer is None or not buffer.fits(grads):
            buffer = _BucketBuffer(grads)
            if keep:
                self._buffers[id(params)] = buffer
        compress = self.compression.compress
        wires = [compress(array) for array in buffer.pack(grads)]
        self._bytes_pending += sum(wire.nbytes for wire, _ in wires)
        name = ctx.names[params[0]]
        if len(wires) == 1:
            handle = allreduce_async_(
                wires[0][0],
                name=name,
                op=self.op,
                prescale_factor=pre,
                postscale_factor=post,
                process_set=ctx.process_set,
            )
        else:
            handle = grouped_allreduce_async_(
                [wire for wire, _ in wires],
                name=name,
                op=self.op,
                prescale_factor=pre,
                postscale_factor=post,
                process_set=ctx.process_set,
            )
        return _BucketAllreduce(handle, grads, buffer, wires)

    def _start_cast_bucket(self, ctx, params, grads, keep: bool, pre: float, post: float):
        """One allreduce of *grads* cast into their :class:`_CastBucket`."""
        bucket = self._buffers.get(id(params)) if keep else None
        if not isinstance(bucket, _CastBucket) or not bucket.fits(grads):
            bucket = _CastBucket(grads, self.compression.wire_dtype)
            if keep:
                self._buffers[id(params)] = bucket
        flat = bucket.pack(grads)
        self._bytes_pending += flat.nbytes
        handle = allreduce_async_(
            flat,
            name=ctx.names[params[0]],
            op=self.op,
            prescale_factor=pre,
            postscale_factor=post,
            process_set=ctx.process_set,
        )
        return _CastBucketAllreduce(handle, grads, bucket)

    def _start_group(self, ctx, params):
        """One allreduce of *params*' dense gradients, named after the first:
        its small ones packed into one flat tensor where it can (see the
        class), else grouped member by member."""
        bucket = self._start_bucket(ctx, params)
        if bucket is not None:
            return bucket
        pre, post = self._scale_factors()
        members = [(p, *self._wire(p)) for p in params]
        self._bytes_pending += sum(wire.nbytes for _, wire, _ in members)
        handle = grouped_allreduce_async_(
            [wire for _, wire, _ in members],
            name=ctx.names[params[0]],
            op=self.op,
            prescale_factor=pre,
            postscale_factor=post,
            process_set=ctx.process_set,
        )
        return _DenseAllreduce(handle, members)


# ---------------------------------------------------------- stateful compressor


class CompressorReducer(GradientReducer):
    """Reduce with a stateful compressor (``Compression.topk(ratio)``,
    ``Compression.powersgd(...)``): at ``synchronize()`` every gradient goes to
    the compressor at once, which runs its own grouped exchange (no overlap
    with backward: it needs all gradients, and one collective per phase beats
    one per tensor).  Its state (residuals, PowerSGD's Q) is the reducer's
    state.  ``op`` is Average or Sum."""

    def __init__(self, compressor: StatefulCompressor, op=Average):
        if not isinstance(compressor, StatefulCompressor):
            raise TypeError(
                f"CompressorReducer takes a stateful compressor such as "
                f"Compression.topk(0.01), got {compressor!r}; use "
                f"AllreduceReducer(compression=...) for casts"
            )
        if op not in (Average, Sum):
            raise ValueError(
                f"{compressor!r} reduces gradients by op=Average or op=Sum, got "
                f"op={op!r}; use Compression.none/fp16/bf16 with other ops"
            )
        self.compressor = compressor
        self.op = op

    def synchronize(self, ctx) -> None:
        """Every gradient (zeros where none was computed) to the compressor, in
        the parameters' order; sparse ones densified and made sparse again."""
        self.bytes_sent_last_step = 0
        grads, sparse = [], []
        for p in ctx.parameters():
            grad = _grad_or_zeros(p)
            if grad.is_sparse:
                grad = grad.to_dense()
                sparse.append((p, grad))
            grads.append((ctx.names[p], grad))
        self.bytes_sent_last_step = self.compressor.reduce(grads, ctx.process_set, self.op)
        for p, dense in sparse:
            p.grad = dense.to_sparse()

    def state_dict(self) -> dict:
        return self.compressor.state_dict()

    def load_state_dict(self, state) -> None:
        self.compressor.load_state_dict(state)


# ---------------------------------------------------------------------- Adasum


class AdasumReducer(GradientReducer):
    """Horovod's ``op=Adasum`` delta scheme: gradients stay local, ``step()``
    runs the wrapped optimizer's step on them and combines the parameter
    deltas of all ranks with Adasum (:func:`.adasum_optimizer.adasum_delta_step`).
    Needs a power-of-two number of ranks.  ``compression`` (none, fp16, bf16)
    casts the deltas."""

    def __init__(self, compression=Compression.none):
        _check_stateless(
            compression, "Adasum combines parameter deltas; use Compression.none, fp16 or bf16"
        )
        self.compression = compression
        self._start: dict = {}  # parameter -> its value before the step (kept buffers)

    def synchronize(self, ctx) -> None:
        """Nothing to reduce before the step: only closes the backward passes."""
        self.bytes_sent_last_step = 0

    def step(self, ctx, base_step, closure=None):
        named = [(ctx.names[p], p) for p in ctx.parameters()]
        result, sent = adasum_delta_step(
            named,
            base_step,
            closure,
            compression=self.compression,
            process_set=ctx.process_set,
            start=self._start,
        )
        if named:
            self.bytes_sent_last_step = sent
        return result
