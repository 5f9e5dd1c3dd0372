"""``hvdlite.lightning``: PyTorch Lightning's ``Trainer`` on hvdlite.

Importing it registers the strategy name ``"hvdlite"`` with Lightning, so::

    import lightning as L
    import hvdlite.lightning  # noqa: F401 - registers strategy="hvdlite"

    trainer = L.Trainer(strategy="hvdlite", max_epochs=10)
    trainer.fit(model, datamodule)

runs data-parallel under ``hvdrun -np 4 python train.py`` (or ``srun``,
``mpiexec``); ``HvdliteStrategy(...)`` takes options (compression, sharded
optimizer state, a process set, hierarchical allreduce).  Layers, innermost
first: :mod:`.environment` answers Lightning's questions about ranks from
hvdlite; :mod:`.strategy` wraps the optimizers and provides the collectives.

Only this package imports Lightning: ``import hvdlite`` and ``import
hvdlite.torch`` never do.  Install it with ``pip install hvdlite[lightning]``.
"""

from lightning.pytorch.strategies import StrategyRegistry

from hvdlite.lightning.environment import HvdliteEnvironment
from hvdlite.lightning.strategy import HvdliteStrategy

__all__ = ["HvdliteEnvironment", "HvdliteStrategy"]

HvdliteStrategy.register_strategies(StrategyRegistry)
