"""``ElasticSampler``: a distributed sampler that picks up mid-epoch after a resize.

Like ``torch.utils.data.DistributedSampler``, each rank gets its share of one
epoch's (optionally shuffled) order; unlike it, the sampler remembers how many
samples of the epoch the whole job has processed (``record_batch``), and a
reset (a relaunch with another ``size()``, or ``load_state_dict``) shares out
only the rest, among the ranks there are now.

The epoch's order is the same on every rank (``seed + epoch``).  Ranks take the
remaining indices in turn (rank r gets positions r, r + size, ...), so after
every rank has processed ``b`` batches of ``batch_size`` the first
``b * batch_size * size`` remaining positions -- exactly what
``record_batch`` counts -- are done, whichever rank did them: nothing is
skipped or repeated across a resize.  When the rest does not divide evenly
among the ranks, its first indices are repeated at the end so that every rank
gets the same number (as DistributedSampler does); choose sizes that divide
evenly when every sample must be seen exactly once.

Cross-rank contract: every rank builds it with the same dataset length,
``shuffle`` and ``seed``, and calls ``record_batch``/``set_epoch`` at the same
points; keep it in the elastic state (``TorchState(..., sampler=sampler)``) so
that commits carry its position.
"""

from __future__ import annotations

import math
import random

import torch.utils.data

from hvdlite.basics import rank, size

__all__ = ["ElasticSampler"]


class ElasticSampler(torch.utils.data.Sampler):
    """Horovod's ``ElasticSampler(dataset, shuffle=True, seed=0)``; see the module doc."""

    def __init__(self, dataset, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0  # samples of this epoch the whole job has processed
        self.num_replicas = 1
        self.rank = 0
        self.remaining_indices: list[int] = []
        self.num_samples = 0
        self.total_size = 0
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Start epoch *epoch* (a new order when shuffling); call it at the end of an epoch,
        so that a commit inside the next one never sees the old position."""
        self.epoch = int(epoch)
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Every rank has processed one more batch of *batch_size* samples."""
        self.processed_num += int(batch_size) * self.num_replicas

    def record_indices(self, indices) -> None:
        """(+) Every rank has processed ``len(indices)`` more samples (a last, short batch)."""
        self.processed_num += len(indices) * self.num_replicas

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state_dict: dict) -> None:
        self.epoch = int(state_dict["epoch"])
        self.processed_num = int(state_dict["processed_num"])
        self.reset()

    def _order(self) -> list[int]:
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        return order

    def reset(self) -> None:
        """Share out what is left of the epoch among the ranks there are now."""
        self.num_replicas, self.rank = size(), rank()
        self.remaining_indices = self._order()[self.processed_num :]
        self.num_samples = math.ceil(len(self.remaining_indices) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        indices = list(self.remaining_indices)
        indices += indices[: self.total_size - len(indices)]  # equal shares (see module doc)
        return iter(indices[self.rank : self.total_size : self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples
