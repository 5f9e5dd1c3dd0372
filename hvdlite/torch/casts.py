"""Stateless gradient casts: cast before the wire, cast back after.

A compressor is a pair of static functions, ``compress(tensor) -> (tensor,
ctx)`` and ``decompress(tensor, ctx) -> tensor``, exactly Horovod's protocol,
so compressors written for Horovod plug in unchanged.  The collectives of
:mod:`hvdlite.torch.mpi_ops` take them as ``compression=``;
:class:`hvdlite.torch.compression.Compression` names them.

Cross-rank contract: every rank must use the same compressor for a given
tensor (the engine checks that dtypes agree and fails the collective if not).
"""

from __future__ import annotations

import torch

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor"]


class Compressor:
    """Interface: compress a tensor before communication, decompress after."""

    @staticmethod
    def compress(tensor: torch.Tensor):
        """Return ``(compressed_tensor, ctx)``; ctx is whatever decompress needs."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx) -> torch.Tensor:
        """Undo :meth:`compress` using the ctx it returned."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """No compression: the tensor goes on the wire as it is."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class _CastCompressor(Compressor):
    """Send floating-point tensors as ``wire_dtype``; other dtypes go unchanged."""

    wire_dtype: torch.dtype

    @classmethod
    def compress(cls, tensor):
        if tensor.dtype.is_floating_point and tensor.dtype != cls.wire_dtype:
            return tensor.to(cls.wire_dtype), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tensor.to(ctx)


class FP16Compressor(_CastCompressor):
    """float16 on the wire: half the bytes of float32; values beyond 65504 overflow."""

    wire_dtype = torch.float16


class BF16Compressor(_CastCompressor):
    """bfloat16 on the wire: float32's range with an 8-bit mantissa."""

    wire_dtype = torch.bfloat16
