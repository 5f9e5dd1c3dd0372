"""Whole-parameter ownership for the sharded optimizer (ZeRO-1/2 for any optimizer).

Used by :class:`~hvdlite.torch.sharded.ShardedOptimizer` for optimizers that are not
known to be element-wise (a class of your own, Adafactor, LBFGS...): each rank owns
whole parameters, shards balanced by bytes (:func:`balanced_shards`, from the
parameter list alone: identical on every rank), and its optimizer steps them as
they are.

A step: one node (the owner's averager allreduced the gradients in buckets during
backward): the other shards' ``.grad`` are dropped.  Elsewhere ``step()`` lays the
gradients out shard after shard in one flat buffer per dtype (each shard padded to
the largest) and reduce-scatters it: each rank receives its shard's gradients, after
backward (whole parameters cannot be cut into equal per-bucket chunks, so this
route does not overlap backward).  After the local step the updated shards are
allgathered into every parameter.
"""

from __future__ import annotations

import weakref

import torch

from hvdlite.torch import mpi_ops as _ops
from hvdlite.torch.shard_elements import GATHER_CHUNK_BYTES, _copy_range

__all__ = ["WholeParameterShards", "balanced_shards"]


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


class WholeParameterShards:
    """The whole-parameter ownership of a :class:`ShardedOptimizer` (module doc)."""

    def __init__(self, owner):
        self._owner = weakref.ref(owner)
        self._params = owner._params
        self._buffers: dict = {}
        self.pieces: list[tuple[int, int, int]] = []

    def partition(self, size: int, rank: int, param_groups) -> list[list[torch.Tensor]]:
        """This rank's parameters per group; sets :attr:`pieces` (global index, 0,
        numel) in the same order, and the flat layout per dtype."""
        sizes = [p.numel() * p.element_size() for p in self._params]
        self.shards = balanced_shards(sizes, size)
        self.owned = self.shards[rank]  # global parameter indices, ascending
        owned = set(self.owned)
        groups, self.pieces, index = [], [], 0
        for group in param_groups:
            mine = []
            for p in group["params"]:
                if index in owned:
                    mine.append(p)
                    self.pieces.append((index, 0, p.numel()))
                index += 1
            groups.append(mine)
        self._layout = self._by_dtype()
        return groups

    # the hooks: none (the one-node averager has its own)
    def start_hooks(self) -> None:
        pass

    def stop_hooks(self) -> None:
        pass

    def pending(self) -> bool:
        return False

    def set_passes(self, passes: int) -> None:
        pass

    def _by_dtype(self) -> dict:
        """dtype -> (its parameters' global indices by shard, the padded block):
        one flat buffer per dtype, shard after shard, each padded to *block*."""
        layout: dict = {}
        for r, shard in enumerate(self.shards):
            for i in shard:
                by_shard = layout.setdefault(self._params[i].dtype, [[] for _ in self.shards])
                by_shard[r].append(i)
        return {
            dtype: (by_shard, max(sum(self._params[i].numel() for i in s) for s in by_shard))
            for dtype, by_shard in layout.items()
        }

    def _buffer(self, what: str, shape: tuple, dtype, device) -> torch.Tensor:
        """A persistent buffer (new memory each step would be paid for again in page
        faults: several times a memcpy's cost for large buffers)."""
        key = (what, dtype)
        buf = self._buffers.get(key)
        if buf is None or buf.shape != shape:
            buf = self._buffers[key] = torch.empty(shape, dtype=dtype, device=device)
        return buf

    def _flat(self, what: str, shards, block: int, value, dtype) -> torch.Tensor:
        """The tensors value(i) of each shard's indices, flat and back to back, each
        shard padded to *block* with zeros, in the buffer *what*."""
        device = self._owner()._device
        pieces = []
        for indices in shards:
            used = 0
            for i in indices:
                pieces.append(value(i).reshape(-1))
                used += pieces[-1].numel()
            if used < block:
                pieces.append(torch.zeros(block - used, dtype=dtype, device=device))
        return torch.cat(pieces, out=self._buffer(what, (len(shards) * block,), dtype, device))

    def reduce(self, averager) -> None:
        owner = self._owner()
        params, process_set, rank = self._params, owner._process_set, owner._rank
        if averager is not None:
            averager.synchronize()  # waits for what backward started (zeros for none)
            self._drop_other_shards()
            return

        # None on this rank counts as zeros, as unsharded; alone in the set (plain
        # torch, as unsharded) a parameter without a gradient is not stepped.
        keep_none = [owner._size == 1 and p.grad is None for p in params]

        def grad(i):
            p = params[i]
            return p.grad if p.grad is not None else torch.zeros_like(p)

        pre, post, op = owner._scales()
        for dtype, (by_shard, block) in self._layout.items():
            if not block:
                continue
            flat = self._flat("grads", by_shard, block, grad, dtype)
            wire, ctx = owner._compression.compress(flat)
            shard = _ops.reducescatter(
                wire,
                op=op,
                name=f"sharded.grads.{dtype}",
                prescale_factor=pre,
                postscale_factor=post,
                process_set=process_set,
            )
            shard = owner._compression.decompress(shard, ctx)
            offset = 0
            for i in by_shard[rank]:
                p, n = params[i], params[i].numel()
                # a view of the received shard: this rank's gradients cost P/N, no copy
                p.grad = None if keep_none[i] else shard[offset : offset + n].view_as(p)
                offset += n
        self._drop_other_shards()

    def _drop_other_shards(self) -> None:
        """ZeRO-2: the other shards' gradients are dropped."""
        rank = self._owner()._rank
        for r, shard in enumerate(self.shards):
            if r != rank:
                for i in shard:
                    self._params[i].grad = None

    def gather(self) -> None:
        """Every rank's updated shard into every parameter, in allgathers of at most
        :data:`GATHER_CHUNK_BYTES` per rank."""
        owner = self._owner()
        params, size, rank = self._params, owner._size, owner._rank
        for dtype, (by_shard, block) in self._layout.items():
            if not block:
                continue
            mine = self._flat("mine", [by_shard[rank]], block, lambda i: params[i].detach(), dtype)
            step = max(1, GATHER_CHUNK_BYTES // mine.element_size())
            for first in range(0, block, step):
                chunk = _ops.allgather(
                    mine[first : first + step],
                    name=f"sharded.params.{dtype}.{first}",
                    process_set=owner._process_set,
                )
                rows = chunk.view(size, -1)
                for r, shard in enumerate(by_shard):
                    if r != rank:
                        _copy_range(rows[r], first, [params[i] for i in shard])

    def zero_grad(self, set_to_none: bool) -> None:
        pass  # the local optimizer's parameters are the real ones: the owner zeroes those
