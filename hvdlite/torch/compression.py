"""Gradient compression, by Horovod's names: ``Compression.none``, ``.fp16``, ...

The stateless casts live in :mod:`hvdlite.torch.casts`; the stateful
compressors ``Compression.topk`` and ``Compression.powersgd`` build on the
collectives in :mod:`hvdlite.torch.compressors` and work through
``DistributedOptimizer`` only.

Cross-rank contract: every rank must use the same compressor for a given
tensor (the engine checks that dtypes agree and fails the collective if not).
"""

from __future__ import annotations

from hvdlite.torch.casts import BF16Compressor, Compressor, FP16Compressor, NoneCompressor
from hvdlite.torch.compressors import PowerSGDCompressor, TopKCompressor

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor", "Compression"]


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
        return TopKCompressor(ratio)

    @staticmethod
    def powersgd(rank: int = 4, start_step: int = 100, seed: int = 0):
        """PowerSGD (Vogels et al., 2019): after ``start_step`` plain steps,
        each gradient matrix is sent as two rank-``rank`` factors (two
        allreduces per step), with error feedback and a warm-started Q
        (seeded by ``seed``, equal on every rank).  Biases go uncompressed."""
        return PowerSGDCompressor(rank, start_step, seed)
