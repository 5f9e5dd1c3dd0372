"""Element-partitioned ownership for the sharded optimizer (ZeRO-2 as DeepSpeed and FSDP do it).

Used by :class:`~hvdlite.torch.sharded.ShardedOptimizer` for the optimizers whose
update of an element depends only on that element's gradient, state and the group's
hyperparameters (:data:`ELEMENTWISE_OPTIMIZERS`): stepping a slice of a parameter
then gives exactly that slice of the whole update.

The trainable parameters are cut into buckets as the unsharded optimizer cuts them
(:func:`~hvdlite.torch.buckets.build_buckets`: per dtype and device, last parameter
first, ``bucket_cap_mb``, a small first bucket).  A bucket is its members' elements
back to back, T of them, padded to N chunks of c = ceil(T / N); rank r owns the
elements [r*c, (r+1)*c) of every bucket.  For those the rank's optimizer steps 1-D
*slices*, parameters that share storage with the real ones (an in-place update of a
slice is the update of those elements), so its state covers about P/N elements.

A step:

1. during backward, when a bucket's last gradient is final
   (``backward_passes_per_step`` passes of each member), its gradients are copied
   into a flat buffer, the parameters' ``.grad`` dropped, and ``reducescatter_async``
   started (on one node the engine runs it through shared memory): each rank
   receives its chunk of the reduced bucket while backward computes the rest.
   ``step()`` starts the buckets backward left incomplete (zeros for missing
   gradients), waits, and drops the flat buffers, so between steps a rank holds
   its chunks' gradients only (ZeRO-2).  The averager route (tests force it; the
   whole-parameter model's on one node) allreduces whole buckets during backward
   instead; ``step()`` then takes views of this rank's chunk and drops ``.grad``;
2. each slice's ``.grad`` is its part of the chunk (a view).  A parameter without a
   gradient on some rank counts as zeros there, and one with a gradient on no rank
   gets zeros and is stepped: the unsharded optimizer's rule (Horovod's), so that
   weight decay and momentum move it the same with and without sharding.  Alone in
   its set (one rank) the unsharded optimizer is plain torch, and so is this: no
   gradient, no step;
3. after the local step, each bucket's owned chunk is copied out of the
   parameters and allgathered into every rank's; the copy is dropped after.

Cross-rank contract: every member of the process set wraps the same parameters in
the same order with the same ``requires_grad`` and bucket cap, so the buckets, their
names and the chunks agree.
"""

from __future__ import annotations

import weakref

import torch

from hvdlite.collectives import waiting_caller
from hvdlite.torch import mpi_ops as _ops
from hvdlite.torch.buckets import FIRST_BUCKET_BYTES, build_buckets
from hvdlite.torch.grad_hooks import check_no_graph, on_grad_accumulated

__all__ = ["ELEMENTWISE_OPTIMIZERS", "ElementShards", "element_buckets", "is_elementwise"]

#: torch.optim classes whose update is element by element for every option
#: (SGD's momentum and nesterov, Adam's amsgrad, NAdam's momentum decay, RMSprop's
#: centered, ...): scalars in their state (``step``, NAdam's ``mu_product``, ASGD's
#: ``eta`` and ``mu``) follow from the step count alone, so every slice has the same.
#: Not here: Adafactor (row and column factors), LBFGS (a global line search),
#: Muon (matrix orthogonalization), SparseAdam (sparse gradients).
ELEMENTWISE_OPTIMIZERS = tuple(
    getattr(torch.optim, name)
    for name in (
        "SGD",
        "Adam",
        "AdamW",
        "Adagrad",
        "Adadelta",
        "Adamax",
        "NAdam",
        "RAdam",
        "RMSprop",
        "Rprop",
        "ASGD",
    )
)

#: The most bytes per rank one parameter allgather moves: each fits the engine's
#: shared-memory area on one node (a larger gather goes through MPI's Allgatherv,
#: several times slower there).
GATHER_CHUNK_BYTES = 8 << 20


def is_elementwise(optimizer: torch.optim.Optimizer, params) -> bool:
    """Whether *optimizer* may step slices of *params*: its class exactly one of
    :data:`ELEMENTWISE_OPTIMIZERS` (a subclass may change ``step``), every
    parameter dense and contiguous (a slice of its storage is a slice of its
    elements)."""
    return type(optimizer) in ELEMENTWISE_OPTIMIZERS and all(
        p.layout is torch.strided and p.is_contiguous() for p in params
    )


def element_buckets(params, cap: int) -> list[list[int]]:
    """Indices of the trainable, non-empty *params*, cut into buckets: per dtype and
    device, with :func:`~hvdlite.torch.buckets.build_buckets` (a parameter it leaves
    alone is a bucket of its own), listed in the order backward usually completes
    them (the last parameter's first); each bucket's indices ascending."""
    params = list(params)
    kinds: dict = {}
    for i, p in enumerate(params):
        if p.requires_grad and p.numel():
            kinds.setdefault((p.dtype, p.device), []).append(i)
    bucket_of: dict = {}
    for indices in kinds.values():
        position = {id(params[i]): i for i in indices}
        for bucket in build_buckets([params[i] for i in indices], cap, FIRST_BUCKET_BYTES):
            members = sorted(position[id(p)] for p in bucket)
            for i in members:
                bucket_of[i] = members
    out, seen = [], set()
    trainable = sorted(i for indices in kinds.values() for i in indices)
    for i in reversed(trainable):
        members = bucket_of.get(i, [i])
        if id(members) not in seen:
            seen.add(id(members))
            out.append(members)
    return out


class _Bucket:
    """One bucket: its members (global indices, ascending) and their offsets in its
    flat layout; per step the in-flight reduce-scatter."""

    __slots__ = (
        "index",
        "name",
        "members",
        "offsets",
        "total",
        "dtype",
        "device",
        "chunk",
        "left",
        "record",
        "slices",
    )

    def __init__(self, index: int, name: str, members: list[int], params):
        self.index = index
        self.name = name
        self.members = members
        self.offsets, total = [], 0
        for i in members:
            self.offsets.append(total)
            total += params[i].numel()
        self.total = total
        self.dtype = params[members[0]].dtype
        self.device = params[members[0]].device
        self.chunk = 0
        self.left = len(members)
        self.record = None  # (handle, wire, compression context) while in flight
        self.slices: list = []  # (global index, slice parameter, start in the chunk)


class ElementShards:
    """The element-partitioned ownership of a :class:`ShardedOptimizer` (module doc).

    *owner* gives the parameters (``_params``), their names, the process set, the
    compression, op and predivide factor; *cap* is the bucket cap in bytes and
    *passes* ``backward_passes_per_step``."""

    def __init__(self, owner, names: dict, cap: int, passes: int):
        self._owner = weakref.ref(owner)
        self._params = owner._params
        self._passes = passes
        self._buckets = [
            _Bucket(k, f"sharded.{names[self._params[members[0]]]}", members, self._params)
            for k, members in enumerate(element_buckets(self._params, cap))
        ]
        self._bucket_of = {i: b for b in self._buckets for i in b.members}
        self._left = [passes] * len(self._params)
        self._had = [False] * len(self._params)  # this rank gave it a gradient
        self._hook_handles: list = []
        self.pieces: list[tuple[int, int, int]] = []

    # ------------------------------------------------------------ the chunks
    def partition(self, size: int, rank: int, param_groups) -> list[list[torch.Tensor]]:
        """This rank's slices for a set of *size*, per parameter group in the
        parameters' order; sets :attr:`pieces` ((global index, first, end) of each
        slice, in the same order)."""
        slice_of = {}
        for b in self._buckets:
            b.chunk = -(-b.total // size)
            b.slices = []
            lo, hi = rank * b.chunk, min((rank + 1) * b.chunk, b.total)
            for i, offset in zip(b.members, b.offsets):
                p = self._params[i]
                first, end = max(lo, offset) - offset, min(hi, offset + p.numel()) - offset
                if first < end:
                    piece = torch.nn.Parameter(
                        p.detach().view(-1)[first:end], requires_grad=p.requires_grad
                    )
                    slice_of[i] = (piece, first, end)
                    b.slices.append((i, piece, offset + first - lo))
        groups, self.pieces, index = [], [], 0
        for group in param_groups:
            mine = []
            for _ in group["params"]:
                if index in slice_of:
                    piece, first, end = slice_of[index]
                    mine.append(piece)
                    self.pieces.append((index, first, end))
                index += 1
            groups.append(mine)
        return groups

    # ------------------------------------------------------------- the hooks
    def start_hooks(self) -> None:
        """Start each bucket's reduce-scatter from backward (the reduce-scatter route)."""
        if self._hook_handles:
            return
        ref = weakref.ref(self)
        for i in self._bucket_of:
            self._hook_handles.append(on_grad_accumulated(self._params[i], _hook(ref, i)))

    def stop_hooks(self) -> None:
        for handle in self._hook_handles:
            handle.remove()
        self._hook_handles = []

    def _grad_ready(self, i: int) -> None:
        left = self._left[i]
        if left <= 0:
            raise AssertionError(
                "Gradients were computed more than backward_passes_per_step times before "
                "call to step(). Increase backward_passes_per_step to accumulate gradients "
                "locally."
            )
        check_no_graph(self._params[i].grad)
        self._left[i] = left - 1
        if left > 1:
            return
        b = self._bucket_of[i]
        b.left -= 1
        if b.left == 0:
            self._start(b)

    def pending(self) -> bool:
        """Whether backward accumulated a gradient since the last reduction."""
        return any(left != self._passes for left in self._left)

    def set_passes(self, passes: int) -> None:
        self._passes = passes
        self._reset()

    def _reset(self) -> None:
        self._left = [self._passes] * len(self._params)
        self._had = [False] * len(self._params)  # this rank gave it a gradient
        for b in self._buckets:
            b.left = len(b.members)
            b.record = None

    def _start(self, b: _Bucket) -> None:
        """Copy the bucket's gradients into its flat buffer (zeros where this rank
        has none), drop them from the parameters, start the reduce-scatter."""
        owner = self._owner()
        size = owner._size
        send = torch.empty(size * b.chunk, dtype=b.dtype, device=b.device)
        send[b.total :].zero_()  # the padding
        for i, offset in zip(b.members, b.offsets):
            p = self._params[i]
            grad, n = p.grad, p.numel()
            if grad is None:
                send[offset : offset + n].zero_()
            else:
                send[offset : offset + n].copy_(grad.reshape(-1))
                self._had[i] = True
                p.grad = None  # ZeRO-2: this rank keeps only its chunk of the result
        compression = owner._compression
        wire, cctx = compression.compress(send)  # held while in flight only
        pre, post, op = owner._scales()
        handle = _ops.reducescatter_async(
            wire,
            name=b.name,
            op=op,
            prescale_factor=pre,
            postscale_factor=post,
            process_set=owner._process_set,
        )
        b.record = (handle, wire, cctx)

    # -------------------------------------------------------------- the step
    def reduce(self, averager) -> None:
        """Each slice's ``.grad``: its part of the reduced bucket (see the module
        doc, steps 1 and 2); the parameters' own ``.grad`` are dropped."""
        owner = self._owner()
        rank = owner._rank
        try:
            if averager is not None:
                averager.synchronize()  # waits for what backward started (zeros for none)
                # Views of the averaged gradients (no copy: a parameter split between
                # ranks keeps its whole gradient's memory until the next backward).
                for b in self._buckets:
                    for i, piece, start in b.slices:
                        grad = self._params[i].grad  # None only alone in the set
                        first = rank * b.chunk + start - b.offsets[b.members.index(i)]
                        piece.grad = (
                            None
                            if grad is None
                            else grad.reshape(-1)[first : first + piece.numel()]
                        )
                for p in self._params:
                    p.grad = None
                return
            with waiting_caller():  # waited on right below, by this thread
                for b in self._buckets:
                    if b.record is None:
                        self._start(b)
            chunks = []
            for b in self._buckets:
                handle, _, cctx = b.record
                chunks.append(owner._compression.decompress(_ops.synchronize(handle), cctx))
            alone = owner._size == 1
            for b, chunk in zip(self._buckets, chunks, strict=True):
                for i, piece, start in b.slices:
                    keep_none = alone and not self._had[i]
                    piece.grad = None if keep_none else chunk[start : start + piece.numel()]
        finally:
            self._reset()

    def gather(self) -> None:
        """Every rank's updated chunk of every bucket into every parameter.  CPU
        buckets: one allgather after another, each of at most
        :data:`GATHER_CHUNK_BYTES` per rank.  Device buckets: every bucket's
        allgather is started before the first is waited for (the engine fuses
        them; each piece would otherwise pay a launch and, staged, a host round
        trip)."""
        owner = self._owner()
        size, rank, process_set = owner._size, owner._rank, owner._process_set
        started = []
        for b in self._buckets:
            members = [self._params[i] for i in b.members]
            mine = torch.empty(b.chunk, dtype=b.dtype, device=b.device)
            _read_range(mine, rank * b.chunk, [p.detach() for p in members])
            on_cpu = b.device.type == "cpu"
            step = max(1, GATHER_CHUNK_BYTES // mine.element_size()) if on_cpu else b.chunk
            for first in range(0, b.chunk, step):
                gather = _ops.allgather if on_cpu else _ops.allgather_async
                rows = gather(
                    mine[first : first + step],
                    name=f"{b.name}.params.{first}",
                    process_set=process_set,
                )
                if on_cpu:
                    _place_rows(rows, b.chunk, first, members, size, rank)
                else:
                    started.append((rows, b.chunk, first, members))
        for handle, chunk, first, members in started:
            _place_rows(_ops.synchronize(handle), chunk, first, members, size, rank)

    def zero_grad(self, set_to_none: bool) -> None:
        for b in self._buckets:
            for _, piece, _ in b.slices:
                if piece.grad is not None:
                    if set_to_none:
                        piece.grad = None
                    else:
                        piece.grad.zero_()


def _place_rows(gathered, chunk: int, first: int, members, size: int, rank: int) -> None:
    """Copy the other ranks' rows of an allgather of elements first.. of every
    rank's chunk into *members*."""
    rows = gathered.view(size, -1)
    for r in range(size):
        if r != rank:
            _copy_range(rows[r], r * chunk + first, members)


def _hook(ref, i: int):
    """The post-accumulate-grad hook of parameter *i*; a dropped optimizer leaves a
    harmless no-op behind."""

    def grad_ready(p):
        shards = ref()
        if shards is not None:
            shards._grad_ready(i)

    return grad_ready


def _copy_range(values: torch.Tensor, first: int, params) -> None:
    """Elements first..first+len(values) of the flat concatenation of *params*, from
    *values*, into the parameters they belong to (those past the end are padding)."""
    last, offset = first + values.numel(), 0
    for p in params:
        n = p.numel()
        lo, hi = max(first, offset), min(last, offset + n)
        if lo < hi:
            p.data.view(-1)[lo - offset : hi - offset].copy_(values[lo - first : hi - first])
        offset += n
        if offset >= last:
            break


def _read_range(out: torch.Tensor, first: int, tensors) -> None:
    """Elements first..first+len(out) of the flat concatenation of *tensors* into
    *out*; zeros past their end."""
    last, offset, filled = first + out.numel(), 0, first
    for t in tensors:
        n = t.numel()
        lo, hi = max(first, offset), min(last, offset + n)
        if lo < hi:
            out[lo - first : hi - first].copy_(t.reshape(-1)[lo - offset : hi - offset])
            filled = hi
        offset += n
        if offset >= last:
            break
    if filled < last:
        out[filled - first :].zero_()
