"""Gradient compression for JAX arrays, by Horovod's names: ``Compression.none``,
``.fp16`` and (+) ``.bf16``.

A compressor is Horovod's pair of static functions, ``compress(x) -> (x,
ctx)`` and ``decompress(x, ctx) -> x`` (the protocol and its base classes are
:mod:`hvdlite.compression`'s); here they are pure JAX functions, so
they work eagerly and inside ``jax.jit`` alike.  The casts touch floating
arrays wider than the target only; other arrays pass unchanged.  What the
cast saves is wire bytes across nodes, where float16 and bfloat16 allreduces
cross as 16 bits; the engine sums both in float32 and rounds once.

Cross-rank contract: every rank must use the same compressor for a given
array (the engine checks that dtypes agree and fails the collective if not).
"""

from __future__ import annotations

import jax.numpy as jnp

from hvdlite.compression import CastCompressor, Compressor, NoneCompressor

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor", "Compression"]


class _JaxCast(CastCompressor):
    """Cast floating arrays wider than 16 bits to ``wire_dtype``; others go unchanged."""

    @classmethod
    def should_cast(cls, dtype) -> bool:
        return bool(jnp.issubdtype(dtype, jnp.floating)) and jnp.dtype(dtype).itemsize > 2

    @staticmethod
    def cast(tensor, dtype):
        return tensor.astype(dtype)


class FP16Compressor(_JaxCast):
    """Cast float32/float64 arrays to float16 for the wire, back after."""

    wire_dtype = jnp.float16


class BF16Compressor(_JaxCast):
    """(+) Cast float32/float64 arrays to bfloat16 for the wire, back after."""

    wire_dtype = jnp.bfloat16


class Compression:
    """The built-in compressors, by Horovod's names (plus ``bf16``)."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
