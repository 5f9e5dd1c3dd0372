"""Sharded optimizer state (ZeRO-1 and -2) behind ``DistributedOptimizer``.

``hvd.DistributedOptimizer(opt, named_parameters=..., shard_optimizer_state=True)``
gives each member of the process set the optimizer state of its shard of the
parameters only.  A step:

1. the gradients are averaged and each rank keeps those of its own shard
   (ZeRO-2: the other gradients are dropped, ``.grad`` becomes None for them).
   Where the engine routes the set's allreduces through one node's shared
   memory, that happens during backward, overlapped with it: the gradients are
   allreduced in buckets as the unsharded ``DistributedOptimizer`` does (MPI's
   reduce-scatter is several times slower than that route on one node).
   Elsewhere (several nodes, GPUs) ``step()`` lays them out shard after shard
   in one flat buffer per dtype (each shard padded to the largest) and
   *reduce-scatters* it: each rank receives its own shard's gradients and no
   other, half the bytes of an allreduce, after backward;
2. the wrapped optimizer's class steps the rank's shard (its state exists for
   that shard only: ZeRO-1);
3. the updated shards are *allgathered* back into every parameter.

Results equal the unsharded optimizer's within floating-point rounding.  Shards
are balanced by bytes, computed from the parameter list alone (identical on
every rank): largest parameter first, each to the shard with the fewest bytes.

Checkpoints: ``consolidate_state_dict(to=0)`` (collective) gathers the shards'
state on one rank (``to=None``: every rank), whose ``state_dict()`` is then the
unsharded optimizer's ``state_dict()``: loadable by the plain torch optimizer.
``load_state_dict()`` takes such a consolidated state at any world size.
``state_dict()`` without a consolidation first fails, naming the fix (the same
contract as torch's ``ZeroRedundancyOptimizer``): a collective hidden in
``state_dict()`` would hang the usual ``if rank == 0: torch.save(...)``.

Cross-rank contract: every member of the set wraps the same parameters in the
same order and calls ``step()``, ``consolidate_state_dict()`` and
``load_state_dict()`` together.
"""

from __future__ import annotations

import contextlib
import inspect

import torch

from hvdlite import basics as _basics
from hvdlite.ops import Average, Max, Sum
from hvdlite.process_sets import global_process_set
from hvdlite.torch import mpi_ops as _ops
from hvdlite.torch.casts import BF16Compressor, FP16Compressor, NoneCompressor
from hvdlite.torch.functions import allgather_object, broadcast_object

__all__ = ["ShardedOptimizer", "balanced_shards"]

_CASTS = (NoneCompressor, FP16Compressor, BF16Compressor)
#: The most bytes per rank one parameter allgather moves (see _gather_parameters).
_GATHER_CHUNK_BYTES = 8 << 20


def balanced_shards(sizes: list[int], n: int) -> list[list[int]]:
    """Indices of *sizes* (bytes per parameter) split into *n* shards of about
    equal bytes: largest first, each to the lightest shard (the lowest-numbered
    among equals); each shard lists its indices in their original order."""
    loads = [0] * n
    shards: list[list[int]] = [[] for _ in range(n)]
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        r = min(range(n), key=lambda r: (loads[r], r))
        shards[r].append(i)
        loads[r] += sizes[i]
    return [sorted(s) for s in shards]


class ShardedOptimizer(torch.optim.Optimizer):
    """A ``torch.optim.Optimizer`` whose state is sharded over a process set.

    ``param_groups`` are the full groups (an LR scheduler adjusts them as
    usual; each step copies their hyperparameters to the shard's groups);
    ``state`` stays empty here: the shard's state lives in ``local``, an
    optimizer of the wrapped class over this rank's parameters.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        compression=NoneCompressor,
        op=Average,
        gradient_predivide_factor: float = 1.0,
        process_set=None,
        averager=None,
    ):
        if not isinstance(compression, type) or not issubclass(compression, _CASTS):
            if not isinstance(compression, _CASTS):
                raise ValueError(
                    "shard_optimizer_state=True supports compression=Compression.none, "
                    ".fp16 or .bf16 (gradients are reduce-scattered as one buffer); "
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
        self._buffers: dict = {}
        self._repartition()
        # On one node the gradients are averaged during backward (module doc, step 1)
        # by *averager*, given an optimizer whose step() does nothing over the same
        # parameters: an unsharded DistributedOptimizer (its hooks, buckets and
        # compression, unchanged).
        self._averager = None
        if self._reduce_whole and averager is not None:
            self._averager = averager(_NoStep(self.param_groups))
        if optimizer.state:  # an optimizer that already stepped: keep its state, sharded
            self.load_state_dict(optimizer.state_dict())

    # ------------------------------------------------------------- the shards
    def _set_size_and_rank(self) -> tuple[int, int]:
        size, rank = self._process_set.size(), self._process_set.rank()
        if size is None or rank is None:
            raise ValueError(
                "shard_optimizer_state=True: this rank is not a member of the optimizer's "
                "process set; build the optimizer on the set's members only."
            )
        return size, rank

    def _repartition(self) -> None:
        """(Re)build the shards and the local optimizer for the set's current size
        (an elastic job may have changed it; the caller then loads a state)."""
        size, rank = self._set_size_and_rank()
        if self._layout_size == size:
            return
        self._size, self._rank = size, rank
        self._reduce_whole = self._device.type == "cpu" and _basics.allreduce_uses_shared_memory(
            self._process_set
        )
        sizes = [p.numel() * p.element_size() for p in self._params]
        self._shards = balanced_shards(sizes, size)
        self._owned = self._shards[rank]  # global parameter indices, ascending
        owned = set(self._owned)
        index = 0
        local_groups = []
        for group in self.param_groups:
            mine = []
            for p in group["params"]:
                if index in owned:
                    mine.append(p)
                index += 1
            local_groups.append({**_hyper(group), "params": mine})
        accepted = inspect.signature(self._wrapped_class.__init__).parameters
        kwargs = {k: v for k, v in self._defaults.items() if k in accepted}
        self.local = self._wrapped_class(local_groups, **kwargs)
        self._layout_size = size
        self._layout = self._by_dtype()  # depends only on the shards: made once per size

    # -------------------------------------------------------------- the step
    def zero_grad(self, set_to_none: bool = True) -> None:
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
        """Reduce-scatter the gradients now: afterwards only this rank's shard has
        ``.grad`` (averaged); use :meth:`skip_synchronize` around the ``step()``."""
        self._repartition()
        self._reduce_gradients()

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
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._repartition()
        if not self._skip_reduce:
            self._reduce_gradients()
        for full, local in zip(self.param_groups, self.local.param_groups):
            local.update(_hyper(full))
        self.local.step()
        self._gather_parameters()
        return loss

    def _by_dtype(self) -> dict:
        """dtype -> (its parameters' global indices by shard, the padded block):
        one flat buffer per dtype, shard after shard, each padded to *block*."""
        layout: dict = {}
        for r, shard in enumerate(self._shards):
            for i in shard:
                by_shard = layout.setdefault(self._params[i].dtype, [[] for _ in self._shards])
                by_shard[r].append(i)
        return {
            dtype: (by_shard, max(sum(self._params[i].numel() for i in s) for s in by_shard))
            for dtype, by_shard in layout.items()
        }

    def _buffer(self, what: str, shape: tuple, dtype) -> torch.Tensor:
        """A persistent buffer of this optimizer (new memory each step would be paid
        for again in page faults: several times a memcpy's cost for large buffers)."""
        key = (what, dtype)
        buf = self._buffers.get(key)
        if buf is None or buf.shape != shape:
            buf = self._buffers[key] = torch.empty(shape, dtype=dtype, device=self._device)
        return buf

    def _flat(self, what: str, shards, block: int, value, dtype) -> torch.Tensor:
        """The tensors value(i) of each shard's indices, flat and back to back, each
        shard padded to *block* with zeros, in this optimizer's buffer *what*."""
        pieces = []
        for indices in shards:
            used = 0
            for i in indices:
                pieces.append(value(i).reshape(-1))
                used += pieces[-1].numel()
            if used < block:
                pieces.append(torch.zeros(block - used, dtype=dtype, device=self._device))
        return torch.cat(pieces, out=self._buffer(what, (len(shards) * block,), dtype))

    def _anywhere_async(self):
        """A handle to which parameters have a gradient on some rank (a parameter
        with none anywhere keeps none and is not stepped, as unsharded)."""
        has_grad = torch.tensor([p.grad is not None for p in self._params], dtype=torch.int32)
        return _ops.allreduce_async(
            has_grad, op=Max, name="sharded.has_grad", process_set=self._process_set
        )

    def _reduce_gradients(self) -> None:
        if self._averager is not None:
            anywhere = self._anywhere_async()
            self._averager.synchronize()  # waits for what backward started
            for p, used in zip(self._params, _ops.synchronize(anywhere).tolist()):
                if not used:
                    p.grad = None  # the averager wrote zeros for it
            self._drop_other_shards()
            return
        params, size = self._params, self._size
        anywhere = _ops.synchronize(self._anywhere_async()).tolist()

        def grad(i):
            p = params[i]
            return p.grad if p.grad is not None else torch.zeros_like(p)

        for dtype, (by_shard, block) in self._layout.items():
            if not block:
                continue
            flat = self._flat("grads", by_shard, block, grad, dtype)
            wire, ctx = self._compression.compress(flat)
            pre, post, op = 1.0, 1.0, self._op
            if self._op == Average and self._predivide != 1.0:
                pre, post, op = 1.0 / self._predivide, self._predivide / size, Sum
            how = dict(
                op=op,
                name=f"sharded.grads.{dtype}",
                prescale_factor=pre,
                postscale_factor=post,
                process_set=self._process_set,
            )
            if self._reduce_whole:
                # One node: the engine's shared-memory allreduce is faster than MPI's
                # reduce-scatter; this rank keeps its shard (a copy: the rest is freed).
                whole = _ops.allreduce_(wire, **how)
                shard = whole[self._rank * block : (self._rank + 1) * block].clone()
            else:
                shard = _ops.reducescatter(wire, **how)
            shard = self._compression.decompress(shard, ctx)
            offset = 0
            for i in by_shard[self._rank]:
                p, n = params[i], params[i].numel()
                # a view of the received shard: this rank's gradients cost P/N, no copy
                p.grad = shard[offset : offset + n].view_as(p) if anywhere[i] else None
                offset += n
        self._drop_other_shards()

    def _drop_other_shards(self) -> None:
        """ZeRO-2: the other shards' gradients are dropped."""
        for r, shard in enumerate(self._shards):
            if r != self._rank:
                for i in shard:
                    self._params[i].grad = None

    def _gather_parameters(self) -> None:
        """Every rank's updated shard into every parameter, in allgathers of at most
        :data:`_GATHER_CHUNK_BYTES` per rank (each fits the engine's shared-memory
        area on one node; one gather of a whole shard would go through MPI's
        Allgatherv, several times slower there)."""
        params, size = self._params, self._size
        for dtype, (by_shard, block) in self._layout.items():
            if not block:
                continue
            mine = self._flat(
                "mine", [by_shard[self._rank]], block, lambda i: params[i].detach(), dtype
            )
            step = max(1, _GATHER_CHUNK_BYTES // mine.element_size())
            for first in range(0, block, step):
                chunk = _ops.allgather(
                    mine[first : first + step],
                    name=f"sharded.params.{dtype}.{first}",
                    process_set=self._process_set,
                )
                rows = chunk.view(size, -1)
                for r, shard in enumerate(by_shard):
                    if r != self._rank:
                        _copy_range(rows[r], first, [params[i] for i in shard])

    # ----------------------------------------------------------- checkpoints
    def consolidate_state_dict(self, to: int | None = 0) -> None:
        """Gather the shards' state (collective over the set) so that ``state_dict()``
        on rank *to* (a global rank; None: on every rank) returns the whole state."""
        self._repartition()
        local = self.local.state_dict()
        owned_in_local_order = [
            i for group_indices in self._local_group_indices() for i in group_indices
        ]
        mine = {owned_in_local_order[li]: _to_cpu(state) for li, state in local["state"].items()}
        shards = allgather_object(mine, name="sharded.consolidate", process_set=self._process_set)
        if to is None or _basics.rank() == to:
            state = {}
            for part in shards:
                state.update(part)
            groups, index = [], 0
            for group in self.param_groups:
                n = len(group["params"])
                groups.append({**_hyper(group), "params": list(range(index, index + n))})
                index += n
            self._consolidated = {"state": dict(sorted(state.items())), "param_groups": groups}
        else:
            self._consolidated = None

    def _local_group_indices(self) -> list[list[int]]:
        """Per group, the global indices of this rank's parameters in it."""
        owned, index, out = set(self._owned), 0, []
        for group in self.param_groups:
            out.append([index + k for k in range(len(group["params"])) if index + k in owned])
            index += len(group["params"])
        return out

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
        state, local_groups, local_state, local_index, start = state_dict["state"], [], {}, 0, 0
        for mine, saved, indices in zip(self.param_groups, groups, self._local_group_indices()):
            ids = []
            for i in indices:
                key = saved["params"][i - start]
                if key in state:
                    local_state[local_index] = state[key]
                ids.append(local_index)
                local_index += 1
            local_groups.append({**_hyper(saved), "params": ids})
            start += len(mine["params"])
        self.local.load_state_dict({"state": local_state, "param_groups": local_groups})

    def broadcast_state(self, root_rank: int) -> None:
        """Every rank takes *root_rank*'s state and hyperparameters (collective)."""
        self.consolidate_state_dict(to=root_rank)
        state = self._consolidated if _basics.rank() == root_rank else None
        self._consolidated = None
        state = broadcast_object(
            state, root_rank, name="sharded.broadcast", process_set=self._process_set
        )
        self.load_state_dict(state)

    def __repr__(self) -> str:
        return (
            f"ShardedOptimizer({self._wrapped_class.__name__}, shard {self._rank} of "
            f"{self._size}: {len(self._owned)} of {len(self._params)} parameters)"
        )


class _NoStep(torch.optim.Optimizer):
    """The parameters of a ShardedOptimizer, for its gradient averager: this
    optimizer's step() changes nothing (the shard's optimizer steps)."""

    def __init__(self, param_groups):
        super().__init__([{"params": list(g["params"])} for g in param_groups], {})

    def step(self, closure=None):
        return None


def _hyper(group: dict) -> dict:
    return {k: v for k, v in group.items() if k != "params"}


def _copy_range(values: torch.Tensor, first: int, params) -> None:
    """Elements first..first+len(values) of the flat concatenation of *params*, from
    *values*, into the parameters they belong to."""
    last, offset = first + values.numel(), 0
    for p in params:
        n = p.numel()
        lo, hi = max(first, offset), min(last, offset + n)
        if lo < hi:
            p.data.view(-1)[lo - offset : hi - offset].copy_(values[lo - first : hi - first])
        offset += n
        if offset >= last:
            break


def _to_cpu(state: dict) -> dict:
    return {k: v.cpu() if torch.is_tensor(v) else v for k, v in state.items()}
