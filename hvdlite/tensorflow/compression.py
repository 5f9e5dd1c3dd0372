"""Gradient compression applied around allreduce (Horovod's ``Compression``).

A compressor turns a tensor into what goes on the wire and back:
``compressed, ctx = compress(t)`` before the collective,
``decompress(reduced, ctx)`` after.  Cross-rank contract: every rank must use
the same compressor for the same tensor, since the wire dtype must match.
"""

from __future__ import annotations

import tensorflow as tf

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor", "Compression"]


class Compressor:
    """Interface: compress before the collective, decompress after."""

    @staticmethod
    def compress(tensor):
        """Return ``(compressed_tensor, ctx)``."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        """Undo :meth:`compress` using its ``ctx``."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Leave tensors as they are."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class _CastCompressor(Compressor):
    wire_dtype: tf.DType = tf.float16

    @classmethod
    def compress(cls, tensor):
        dtype = tensor.dtype
        if dtype.is_floating and dtype != cls.wire_dtype:
            tensor = tf.cast(tensor, cls.wire_dtype)
        return tensor, dtype

    @staticmethod
    def decompress(tensor, ctx):
        if ctx is not None and tensor.dtype != ctx:
            tensor = tf.cast(tensor, ctx)
        return tensor


class FP16Compressor(_CastCompressor):
    """Send floating-point tensors as float16 (half the bytes of float32)."""

    wire_dtype = tf.float16


class BF16Compressor(_CastCompressor):
    """(+) Round floating-point tensors to bfloat16 before the reduction.

    The engine reduces bfloat16 in float32 (numpy has no bfloat16), so this
    keeps bfloat16's range and rounding but does not halve the bytes sent;
    prefer ``fp16`` for bandwidth.
    """

    wire_dtype = tf.bfloat16


class Compression:
    """The available compressors: ``none``, ``fp16`` and (+) ``bf16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
