"""CUDA tensors on the engine's device path (the adapter's device branch).

Only tensors with ``tensor.device.type == "cuda"`` come here.  A CUDA tensor
goes to the engine as a zero-copy CuPy view of its memory (bfloat16 as its
int16 bits, as on the CPU path); results come back as torch CUDA tensors
sharing the engine's memory.  Ordering: the engine's stream waits for the
stream that was current (torch's and CuPy's) when the collective was
submitted, and that stream waits for the collective before the handle
completes, so work enqueued on it afterwards sees the result without the host
waiting for the GPU.  Use the result on that stream (or synchronize it).
"""

from __future__ import annotations

import numpy as np
import torch

from hvdlite.exceptions import ArgumentError

__all__ = ["check", "engine_view", "held_view", "is_device_result", "to_torch"]


def check(tensor: torch.Tensor, what: str) -> None:
    """ArgumentError for tensors on devices the engine cannot move (not CPU or CUDA)."""
    if tensor.device.type != "cuda":
        raise ArgumentError(
            f"hvdlite.torch.{what}: the tensor is on device '{tensor.device}'; hvdlite moves "
            "CPU and CUDA tensors only: move it with tensor.cpu() or tensor.cuda() first"
        )


_cuda_backend = None


def _backend():
    global _cuda_backend
    if _cuda_backend is None:
        from hvdlite.device import registry

        _cuda_backend = registry.backend("cuda")
    return _cuda_backend


def engine_view(tensor: torch.Tensor):
    """The engine's (CuPy) view of a contiguous CUDA tensor, no copy; it keeps
    the tensor alive."""
    return _backend().wrap(tensor, "hvdlite.torch")


def held_view(tensor: torch.Tensor):
    """:func:`engine_view` of a tensor (autograd's too: the view reads its memory)
    that the caller holds until the collective completes: made once per tensor
    and reused while the tensor keeps its memory, shape and dtype."""
    return _backend().wrap_held(tensor, "hvdlite.torch")


def is_device_result(array) -> bool:
    """Whether an engine result is a device array (not numpy memory, not a tensor)."""
    if isinstance(array, (np.ndarray, torch.Tensor)):
        return False
    return hasattr(array, "__cuda_array_interface__")


def to_torch(array) -> torch.Tensor:
    """A torch CUDA tensor sharing the memory of the engine's array."""
    return torch.as_tensor(array, device=torch.device("cuda", array.device.id))
