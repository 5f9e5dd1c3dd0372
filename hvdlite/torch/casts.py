"""Stateless gradient casts for torch tensors: cast before the wire, cast back after.

The protocol (``compress(tensor) -> (tensor, ctx)``, ``decompress(tensor, ctx)
-> tensor``, Horovod's) and its base classes are :mod:`hvdlite.compression`'s;
here torch fills in the cast: a floating-point tensor whose dtype is not the
wire's goes as ``wire_dtype`` (``Tensor.to``, so gradients flow through it).
The collectives of :mod:`hvdlite.torch.mpi_ops` take these as
``compression=``; :class:`hvdlite.torch.compression.Compression` names them.

Cross-rank contract: every rank must use the same compressor for a given
tensor (the engine checks that dtypes agree and fails the collective if not).
"""

from __future__ import annotations

import torch

from hvdlite.compression import CastCompressor, Compressor, NoneCompressor

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor"]


class _TorchCast(CastCompressor):
    """Send floating-point tensors as ``wire_dtype``; other dtypes go unchanged."""

    @classmethod
    def should_cast(cls, dtype: torch.dtype) -> bool:
        return dtype.is_floating_point and dtype != cls.wire_dtype

    @staticmethod
    def cast(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return tensor.to(dtype)


class FP16Compressor(_TorchCast):
    """float16 on the wire: half the bytes of float32; values beyond 65504 overflow."""

    wire_dtype = torch.float16


class BF16Compressor(_TorchCast):
    """bfloat16 on the wire: float32's range with an 8-bit mantissa; half the bytes
    of float32 where the set spans nodes."""

    wire_dtype = torch.bfloat16
