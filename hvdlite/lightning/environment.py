"""``HvdliteEnvironment``: Lightning's view of the job, taken from hvdlite.

Lightning asks a ``ClusterEnvironment`` for the ranks and the world size.  The
processes were started by hvdrun, ``mpiexec`` or ``srun`` before Python ran, and
hvdlite already knows every answer (``hvd.rank()``, ``hvd.local_rank()``, ...),
so this environment only repeats them: it never starts a process and never lets
Lightning change a rank.  With a process set, the ranks are the set's.

Cross-rank contract: none (every answer is local).
"""

from __future__ import annotations

from lightning.fabric.plugins.environments import ClusterEnvironment

import hvdlite.torch as hvd

__all__ = ["HvdliteEnvironment"]


class HvdliteEnvironment(ClusterEnvironment):
    """Ranks, sizes and the node index of this process, as hvdlite counts them.

    ``process_set``: the hvdlite process set that trains (default: every rank);
    ``global_rank()`` is then this rank's index in the set and ``world_size()``
    its size.  hvdlite must be initialized before the first question.
    """

    def __init__(self, process_set=hvd.global_process_set):
        super().__init__()
        self.process_set = process_set

    @property
    def creates_processes_externally(self) -> bool:
        return True  # the launcher started every rank already

    @property
    def main_address(self) -> str:
        # Lightning reads it only to start torch.distributed, which hvdlite never does.
        return "127.0.0.1"

    @property
    def main_port(self) -> int:
        return 0

    @staticmethod
    def detect() -> bool:
        """Whether hvdlite runs here (Lightning never picks this environment by itself:
        ``HvdliteStrategy`` brings it)."""
        return hvd.is_initialized()

    def world_size(self) -> int:
        return self.process_set.size()

    def set_world_size(self, size: int) -> None:
        if size != self.world_size():
            raise ValueError(
                f"Lightning asked for a world size of {size}, but the launcher started "
                f"{self.world_size()} ranks in this process set; with hvdlite the launcher "
                f"decides: `hvdrun -np {size} python ...`."
            )

    def global_rank(self) -> int:
        return self.process_set.rank()

    def set_global_rank(self, rank: int) -> None:
        if rank != self.global_rank():
            raise ValueError(
                f"Lightning tried to make this process rank {rank}; hvdlite's launcher "
                f"made it rank {self.global_rank()}, which cannot change."
            )

    def local_rank(self) -> int:
        return hvd.local_rank()

    def node_rank(self) -> int:
        return hvd.cross_rank()
