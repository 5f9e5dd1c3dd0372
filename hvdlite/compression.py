"""Horovod's compressor protocol, written once for every framework.

A compressor turns a tensor into what goes on the wire and back:
``compressed, ctx = compress(tensor)`` before the collective,
``decompress(reduced, ctx)`` after.  Both are called on the class (Horovod
passes compressors as classes: ``compression=Compression.fp16``), so
compressors written for Horovod plug in unchanged.

- :class:`Compressor` is the interface each framework's compressors derive from;
- :class:`NoneCompressor` sends tensors as they are (``Compression.none``);
- :class:`CastCompressor` sends floating-point tensors as its ``wire_dtype``
  and casts the result back; a framework's subclass says which dtypes it casts
  (:meth:`~CastCompressor.should_cast`) and how (:meth:`~CastCompressor.cast`),
  and its ``FP16Compressor`` and ``BF16Compressor`` name the wire dtype.

The framework namespaces (``hvdlite.torch.Compression`` ...) live with each
adapter; nothing here imports a framework.

Cross-rank contract: every rank must use the same compressor for a given
tensor (the engine checks that dtypes agree and fails the collective if not).
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = ["Compressor", "NoneCompressor", "CastCompressor"]


class Compressor:
    """Interface: compress a tensor before communication, decompress after."""

    @staticmethod
    def compress(tensor):
        """Return ``(compressed_tensor, ctx)``; ctx is whatever decompress needs."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        """Undo :meth:`compress` using the ctx it returned."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """No compression: the tensor goes on the wire as it is, and comes back as it is."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class CastCompressor(Compressor):
    """Send the tensors :meth:`should_cast` accepts as ``wire_dtype``; others go unchanged.

    ``compress`` returns the cast tensor with the input's dtype as ctx, or the
    input itself with ctx None; ``decompress`` casts back to that dtype (a
    tensor that already has it is returned as it is).
    """

    #: The framework's dtype on the wire (set by each concrete compressor).
    wire_dtype: ClassVar[Any] = None

    @classmethod
    def compress(cls, tensor):
        dtype = tensor.dtype
        if cls.should_cast(dtype):
            return cls.cast(tensor, cls.wire_dtype), dtype
        return tensor, None

    @classmethod
    def decompress(cls, tensor, ctx):
        if ctx is None or tensor.dtype == ctx:
            return tensor
        return cls.cast(tensor, ctx)

    @classmethod
    def should_cast(cls, dtype) -> bool:
        """Whether a tensor of ``dtype`` is sent as ``wire_dtype`` (the framework's rule)."""
        raise NotImplementedError

    @staticmethod
    def cast(tensor, dtype):
        """``tensor`` as ``dtype``, in the framework's own way (differentiable where it can be)."""
        raise NotImplementedError
