"""Gradient compression for JAX arrays, by Horovod's names: ``Compression.none``,
``.fp16`` and (+) ``.bf16``.

A compressor is Horovod's pair of static functions, ``compress(x) -> (x,
ctx)`` and ``decompress(x, ctx) -> x``; here they are pure JAX functions, so
they work eagerly and inside ``jax.jit`` alike.  The casts touch floating
arrays wider than the target only; other arrays pass unchanged.  What the
cast saves is wire bytes: the engine still sums float16 in a float32 buffer,
and bfloat16 is summed in float32.

Cross-rank contract: every rank must use the same compressor for a given
array (the engine checks that dtypes agree and fails the collective if not).
"""

from __future__ import annotations

import jax.numpy as jnp

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor", "Compression"]


class Compressor:
    """Interface: compress an array before communication, decompress after."""

    @staticmethod
    def compress(tensor):
        """Return ``(compressed, ctx)``; ctx is whatever decompress needs."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        """Undo :meth:`compress` using the ctx it returned."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Send arrays as they are."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


def _cast(tensor, target):
    dtype = tensor.dtype
    if jnp.issubdtype(dtype, jnp.floating) and jnp.dtype(dtype).itemsize > 2:
        return tensor.astype(target), dtype
    return tensor, None


def _uncast(tensor, ctx):
    return tensor if ctx is None else tensor.astype(ctx)


class FP16Compressor(Compressor):
    """Cast float32/float64 arrays to float16 for the wire, back after."""

    @staticmethod
    def compress(tensor):
        return _cast(tensor, jnp.float16)

    @staticmethod
    def decompress(tensor, ctx):
        return _uncast(tensor, ctx)


class BF16Compressor(Compressor):
    """(+) Cast float32/float64 arrays to bfloat16 for the wire, back after."""

    @staticmethod
    def compress(tensor):
        return _cast(tensor, jnp.bfloat16)

    @staticmethod
    def decompress(tensor, ctx):
        return _uncast(tensor, ctx)


class Compression:
    """The built-in compressors, by Horovod's names (plus ``bf16``)."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
