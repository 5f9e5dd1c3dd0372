"""``horovod.runner.common.util.env``: the rank and size a launcher gave this process."""

from __future__ import annotations

import os

__all__ = ["get_env_rank_and_size"]


def get_env_rank_and_size() -> tuple[int, int]:
    """(rank, size) from the launcher's variables; (0, 1) outside a launcher."""
    for rank_name, size_name in (
        ("HOROVOD_RANK", "HOROVOD_SIZE"),
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
        ("PMI_RANK", "PMI_SIZE"),
    ):
        rank, size = os.environ.get(rank_name), os.environ.get(size_name)
        if rank is not None and size is not None:
            return int(rank), int(size)
        if rank is not None or size is not None:
            raise RuntimeError(
                f"Could not determine process rank and size: only one of {rank_name} "
                f"and {size_name} found in environment"
            )
    return 0, 1
