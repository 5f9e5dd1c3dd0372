"""Small dense gradients cross a graph's numpy function packed into one flat tensor.

Inside a graph every gradient that reaches the engine costs TensorFlow a
conversion into the numpy function and one out of it, and costs the engine an
entry to reduce and complete.  A model with many small weights (a ResNet's
BatchNormalization scales and offsets) pays that per-tensor price more than
it pays for its bytes.  So, in a graph, the small gradients of one group that
share a wire dtype are reshaped to 1-D and joined by one ``tf.concat``; the
flat tensor is reduced as one member of its group, and one ``tf.split`` plus
reshapes give every gradient back its own tensor.  Large gradients travel
as they are: for them the two extra copies would cost more than they save.

Only element-wise reductions may be packed (Sum, Average, with their scale
factors; never Adasum, whose result depends on each tensor as a whole): every
element then goes through the same arithmetic as when its tensor travels
alone, so the reduced values are identical.

Cross-rank contract: which gradients are packed, and in which order, follows
from their wire dtypes, static shapes and groups alone, which every member of
the process set shares, so every member packs alike and the engine sees the
same tensors everywhere.
"""

from __future__ import annotations

import tensorflow as tf

__all__ = ["PACK_BYTES", "Packing"]

#: Gradients smaller than this many bytes are packed.  Measured here: 161
#: ResNet-sized gradients cross a numpy function 1.0-1.5 ms slower as 161
#: tensors than as one (some 7-9 us per tensor in and out); a gradient of
#: several MB would pay more for its two extra copies (tf.concat in, tf.split
#: out) than that.  For the ResNet of ``bench_keras_models``, limits from
#: 16 KiB to 2 MiB measured alike.
PACK_BYTES = 64 << 10


class Packing:
    """Which tensors of which group travel packed: ``buckets``, lists of tensor
    positions of one group and one dtype, each packed into one flat tensor."""

    def __init__(self, tensors, groups, max_bytes: int = PACK_BYTES):
        self._shapes = [t.shape for t in tensors]
        self.buckets = []
        for members in groups:
            by_dtype: dict = {}
            for m in members:
                shape, dtype = tensors[m].shape, tensors[m].dtype
                if shape.is_fully_defined() and shape.num_elements() * dtype.size < max_bytes:
                    by_dtype.setdefault(dtype, []).append(m)
            self.buckets += [bucket for bucket in by_dtype.values() if len(bucket) > 1]
        self._where: dict[int, int] = {}  # tensor or bucket-head position -> packed position

    def pack(self, tensors, groups) -> tuple[list, list]:
        """``(tensors, groups)`` with every bucket replaced by its flat tensor, which
        takes its first member's place."""
        if not self.buckets:
            return list(tensors), groups
        heads = {bucket[0]: bucket for bucket in self.buckets}
        tails = {m for bucket in self.buckets for m in bucket[1:]}
        packed, where = [], self._where
        for i, t in enumerate(tensors):
            if i in tails:
                continue
            where[i] = len(packed)
            if i in heads:
                t = tf.concat([tf.reshape(tensors[m], [-1]) for m in heads[i]], 0)
            packed.append(t)
        return packed, [[where[m] for m in members if m in where] for members in groups]

    def packed_names(self, names) -> list:
        """*names* (a string per tensor, e.g. its framework dtype's) for the tensors
        :meth:`pack` returned: a flat tensor's is its members', joined by "+" in
        order.  Call after :meth:`pack`."""
        if not self.buckets:
            return list(names)
        heads = {bucket[0]: bucket for bucket in self.buckets}
        packed = [None] * len(self._where)
        for i, j in self._where.items():
            packed[j] = "+".join(names[m] for m in heads[i]) if i in heads else names[i]
        return packed

    def unpack(self, outs) -> list:
        """One reduced tensor per original tensor, from the reduced packed tensors."""
        if not self.buckets:
            return list(outs)
        result = [None] * len(self._shapes)
        for i, j in self._where.items():
            result[i] = outs[j]
        for bucket in self.buckets:
            sizes = [self._shapes[m].num_elements() for m in bucket]
            parts = tf.split(outs[self._where[bucket[0]]], sizes)
            for m, part in zip(bucket, parts, strict=True):
                result[m] = tf.reshape(part, self._shapes[m])
        return result
