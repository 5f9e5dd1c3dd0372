"""Gradient compression for allreduce: cast before the wire, cast back after.

(The stateful compressors ``Compression.topk`` and ``Compression.powersgd``
live in :mod:`hvdlite.torch.compressors`; they work through
``DistributedOptimizer`` only.)

A compressor is a pair of static functions, ``compress(tensor) -> (tensor,
ctx)`` and ``decompress(tensor, ctx) -> tensor``, exactly Horovod's protocol,
so compressors written for Horovod plug in unchanged.

Cross-rank contract: every rank must use the same compressor for a given
tensor (the engine checks that dtypes agree and fails the collective if not).
"""

from __future__ import annotations

import torch

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor", "Compression"]


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


class Compression:
    """The built-in compressors, by Horovod's names (plus ``bf16``, ``topk``
    and ``powersgd``).

    ``none``, ``fp16`` and ``bf16`` are stateless casts usable anywhere a
    ``compression=`` argument is taken.  ``topk(ratio)`` and
    ``powersgd(rank, start_step)`` build a fresh stateful compressor (see
    :mod:`hvdlite.torch.compressors`) for one ``DistributedOptimizer``: pass
    a new one to each optimizer.
    """

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor

    @staticmethod
    def topk(ratio: float = 0.01):
        """Top-k sparsification with error feedback: each step sends the
        ``ceil(ratio * n)`` largest-magnitude entries of every gradient (its
        values and int64 indices, by allgather) and keeps the rest as a
        per-parameter residual added to the next step's gradient."""
        from hvdlite.torch.compressors import TopKCompressor  # it builds on mpi_ops

        return TopKCompressor(ratio)

    @staticmethod
    def powersgd(rank: int = 4, start_step: int = 100, seed: int = 0):
        """PowerSGD (Vogels et al., 2019): after ``start_step`` plain steps,
        each gradient matrix is sent as two rank-``rank`` factors (two
        allreduces per step), with error feedback and a warm-started Q
        (seeded by ``seed``, equal on every rank).  Biases go uncompressed."""
        from hvdlite.torch.compressors import PowerSGDCompressor

        return PowerSGDCompressor(rank, start_step, seed)
