"""Keras on PyTorch: gradients and variables go through :mod:`hvdlite.torch`.

Keras' torch backend runs the train step eagerly; each Keras variable holds a
``torch.nn.Parameter`` (``variable.value``) and the step hands the optimizer
the parameters' ``.grad`` tensors.  :class:`TorchGradientReducer` reduces them
with :func:`hvdlite.torch.mpi_ops.grouped_allreduce_async`: every group (one
unless ``groups`` says otherwise) is submitted before any is waited on, and
each group is negotiated and fused by the engine as one unit.  CUDA tensors
take the engine's device path by themselves.  Broadcasts overwrite the
parameters' storage in place (:func:`hvdlite.torch.broadcast_parameters`).

Cross-rank contract: :class:`~hvdlite.keras._backend.KerasBackend`'s.
"""

from __future__ import annotations

import torch

from hvdlite._optimizer_args import reduction_scales, split_groups
from hvdlite.collectives import waiting_caller
from hvdlite.torch.casts import BF16Compressor, FP16Compressor, NoneCompressor
from hvdlite.torch.functions import broadcast_parameters
from hvdlite.torch.mpi_ops import grouped_allreduce_async, synchronize

from ._backend import KerasBackend

__all__ = ["BACKEND", "Compression", "TorchBackend", "TorchGradientReducer"]


class Compression:
    """Horovod's compressors for Keras on torch: stateless casts of each gradient."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor


class TorchGradientReducer:
    """``reducer(grads, variables) -> grads`` for torch gradients (see the module docstring).

    With ``op=Average`` and ``gradient_predivide_factor=f`` the result is
    ``sum(g) / size``, scaled by ``1/f`` before the sum and ``f/size`` after it
    (Horovod's split).
    """

    def __init__(
        self, name, compression, sparse_as_dense, op, gradient_predivide_factor, groups, process_set
    ):
        self.prescale, self.postscale = reduction_scales(op, gradient_predivide_factor)
        self.name = name
        self.compression = compression
        self.op = op
        self.groups = groups
        self.process_set = process_set

    def __call__(self, grads, variables=None):
        grads = list(grads)
        ps = self.process_set
        if not ps.included() or ps.size() == 1:
            return grads
        present = [i for i, g in enumerate(grads) if g is not None]
        wire, ctxs = {}, {}
        for i in present:
            g = grads[i]
            if not isinstance(g, torch.Tensor):
                raise TypeError(
                    f"hvdlite.keras (torch backend): gradient {i} is a {type(g).__name__}, "
                    "not a torch.Tensor; are KERAS_BACKEND and the tensors' framework the same?"
                )
            if not g.dtype.is_floating_point:
                raise ValueError(
                    f"hvdlite: gradient {i} has dtype {g.dtype}; gradients must be floating point."
                )
            wire[i], ctxs[i] = self.compression.compress(g)
        groups = split_groups(present, self.groups, variables)
        with waiting_caller():  # waited on right below, by this thread
            handles = [
                grouped_allreduce_async(
                    [wire[i] for i in group],
                    op=self.op,
                    prescale_factor=self.prescale,
                    postscale_factor=self.postscale,
                    process_set=ps,
                )
                for group in groups
            ]
        out = list(grads)
        for group, handle in zip(groups, handles, strict=True):
            for i, reduced in zip(group, synchronize(handle), strict=True):
                out[i] = self.compression.decompress(reduced, ctxs[i])
        return out


class TorchBackend(KerasBackend):
    """:class:`~hvdlite.keras._backend.KerasBackend` for ``KERAS_BACKEND=torch``."""

    name = "torch"
    Compression = Compression

    def gradient_reducer(
        self,
        *,
        name,
        compression,
        sparse_as_dense,
        op,
        gradient_predivide_factor,
        groups,
        process_set,
    ):
        # sparse_as_dense: Keras' torch backend has dense gradients only.
        return TorchGradientReducer(
            name, compression, sparse_as_dense, op, gradient_predivide_factor, groups, process_set
        )

    def broadcast_variables(self, variables, root_rank, process_set):
        broadcast_parameters([_parameter(v) for v in variables], root_rank, process_set=process_set)


def _parameter(variable) -> torch.Tensor:
    """The torch tensor a Keras variable keeps its value in (written in place)."""
    value = getattr(variable, "value", variable)
    if not isinstance(value, torch.Tensor):
        raise TypeError(
            f"hvdlite.keras (torch backend): cannot broadcast a {type(variable).__name__} "
            "that holds no torch tensor; pass Keras variables of this backend."
        )
    return value


BACKEND = TorchBackend()
