"""Public reductions: ``allreduce``, ``grouped_allreduce``, ``reducescatter``,
``grouped_reducescatter`` with compression and ``tf.IndexedSlices`` support.

These are Horovod's ``horovod.tensorflow`` top-level functions.  A
``tf.IndexedSlices`` is reduced as two allgathers (values and indices), which
represents the summed tensor exactly; with ``op=Average`` the values are then
divided by the set size.

Cross-rank contract: every member of ``process_set`` calls the same reductions
in the same order with the same dtypes, shapes and compression; every member
gets the reduced result.
"""

from __future__ import annotations

import tensorflow as tf

from .compression import Compression
from .mpi_ops import (
    Adasum,
    Average,
    Sum,
    _grouped_allreduce,
    _grouped_reducescatter,
    global_process_set,
    grouped_allgather,
    handle_average_backwards_compatibility,
)

_no_autograph = tf.autograph.experimental.do_not_convert

__all__ = ["allreduce", "grouped_allreduce", "reducescatter", "grouped_reducescatter"]


def _sparse_reduce(slices, op, prescale_factor, postscale_factor, process_set, ignore_name_scope):
    if op == Adasum:
        raise NotImplementedError(
            "The Adasum reduction does not support sparse tensors; pass "
            "sparse_as_dense=True or convert with tf.convert_to_tensor first."
        )
    if op not in (Sum, Average):
        raise NotImplementedError("Only Sum and Average ops are supported with tf.IndexedSlices")
    if prescale_factor != 1.0 or postscale_factor != 1.0:
        raise NotImplementedError("Pre/postscale_factor are not supported with tf.IndexedSlices")
    parts = []
    for s in slices:
        parts += [s.values, s.indices]
    gathered = grouped_allgather(
        parts, ignore_name_scope=ignore_name_scope, process_set=process_set
    )
    out = []
    for i, s in enumerate(slices):
        values, indices = gathered[2 * i], gathered[2 * i + 1]
        if op == Average:
            values = values / tf.cast(process_set.size(), values.dtype)
        out.append(tf.IndexedSlices(values, indices, dense_shape=s.dense_shape))
    return out


@_no_autograph
def grouped_allreduce(
    tensors,
    average=None,
    device_dense="",
    device_sparse="",
    compression=Compression.none,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
    ignore_name_scope=False,
    name=None,
):
    """Reduce a list of tensors (or ``tf.IndexedSlices``) as one negotiated group.

    Returns a list in the input order; dense entries have their input's shape
    and dtype.  Default op is Average.
    """
    if not tensors:
        return tensors
    op = handle_average_backwards_compatibility(op, average)
    tensors = list(tensors)
    dense_idx = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    sparse_idx = [i for i, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)]
    out = [None] * len(tensors)
    if sparse_idx:
        reduced = _sparse_reduce(
            [tensors[i] for i in sparse_idx],
            op,
            prescale_factor,
            postscale_factor,
            process_set,
            ignore_name_scope,
        )
        for i, r in zip(sparse_idx, reduced, strict=True):
            out[i] = r
    if dense_idx:
        dense = [tf.convert_to_tensor(tensors[i]) for i in dense_idx]
        compressed, ctxs = zip(*[compression.compress(t) for t in dense], strict=True)
        reduced = _grouped_allreduce(
            list(compressed),
            name=name,
            op=op,
            prescale_factor=prescale_factor,
            postscale_factor=postscale_factor,
            ignore_name_scope=ignore_name_scope,
            process_set=process_set,
        )
        for i, r, ctx in zip(dense_idx, reduced, ctxs, strict=True):
            out[i] = compression.decompress(r, ctx)
    return out


@_no_autograph
def allreduce(
    tensor,
    average=None,
    device_dense="",
    device_sparse="",
    compression=Compression.none,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    name=None,
    process_set=global_process_set,
    ignore_name_scope=False,
):
    """Reduce ``tensor`` across the set (default op Average); every rank gets the result.

    ``tensor`` may be a ``tf.Tensor``, ``tf.Variable`` or ``tf.IndexedSlices``;
    its shape must match on every rank.  Differentiable.
    """
    return grouped_allreduce(
        [tensor],
        op=handle_average_backwards_compatibility(op, average),
        compression=compression,
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
        process_set=process_set,
        ignore_name_scope=ignore_name_scope,
        name=name,
    )[0]


@_no_autograph
def grouped_reducescatter(
    tensors,
    device_dense="",
    compression=Compression.none,
    op=Average,
    process_set=global_process_set,
    prescale_factor=1.0,
    postscale_factor=1.0,
    name=None,
    ignore_name_scope=False,
):
    """Reduce each tensor across the set and give member i its i-th block of rows.

    One negotiated group for the whole list.  Op is Sum or Average.
    """
    if not tensors:
        return tensors
    compressed, ctxs = zip(
        *[compression.compress(tf.convert_to_tensor(t)) for t in tensors], strict=True
    )
    reduced = _grouped_reducescatter(
        list(compressed),
        name=name,
        op=op,
        ignore_name_scope=ignore_name_scope,
        process_set=process_set,
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
    )
    return [compression.decompress(r, ctx) for r, ctx in zip(reduced, ctxs, strict=True)]


@_no_autograph
def reducescatter(
    tensor,
    device_dense="",
    compression=Compression.none,
    op=Average,
    name=None,
    process_set=global_process_set,
    ignore_name_scope=False,
    prescale_factor=1.0,
    postscale_factor=1.0,
):
    """Reduce ``tensor`` across the set; member i gets the i-th block of dim-0 rows
    (the first ``d0 % size`` members get one extra row)."""
    return grouped_reducescatter(
        [tensor],
        compression=compression,
        op=op,
        process_set=process_set,
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
        name=name,
        ignore_name_scope=ignore_name_scope,
    )[0]
