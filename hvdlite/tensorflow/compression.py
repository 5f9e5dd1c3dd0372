"""Gradient compression applied around allreduce (Horovod's ``Compression``).

A compressor turns a tensor into what goes on the wire and back:
``compressed, ctx = compress(t)`` before the collective,
``decompress(reduced, ctx)`` after; the protocol and its base classes are
:mod:`hvdlite.compression`'s, and the casts here are ``tf.cast``.  Cross-rank
contract: every rank must use the same compressor for the same tensor, since
the wire dtype must match.
"""

from __future__ import annotations

import tensorflow as tf

from hvdlite.compression import CastCompressor, Compressor, NoneCompressor

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor", "Compression"]


class _TensorFlowCast(CastCompressor):
    """Send floating-point tensors as ``wire_dtype`` (``tf.cast``); other dtypes go unchanged."""

    @classmethod
    def should_cast(cls, dtype: tf.DType) -> bool:
        return dtype.is_floating and dtype != cls.wire_dtype

    @staticmethod
    def cast(tensor, dtype: tf.DType):
        return tf.cast(tensor, dtype)


class FP16Compressor(_TensorFlowCast):
    """Send floating-point tensors as float16 (half the bytes of float32)."""

    wire_dtype = tf.float16


class BF16Compressor(_TensorFlowCast):
    """(+) Round floating-point tensors to bfloat16 before the reduction.

    float32's range with an 8-bit mantissa.  The engine sums bfloat16 in float32
    and rounds once; where the set spans nodes its allreduces cross as 16 bits,
    half the bytes of float32, as ``fp16``'s do.
    """

    wire_dtype = tf.bfloat16


class Compression:
    """The available compressors: ``none``, ``fp16`` and (+) ``bf16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
