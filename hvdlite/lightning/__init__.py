"""``hvdlite.lightning``: PyTorch Lightning's ``Trainer`` on hvdlite.

Importing it registers the strategy name ``"hvdlite"`` with Lightning, so::

    import lightning as L
    import hvdlite.lightning  # noqa: F401 - registers strategy="hvdlite"

    trainer = L.Trainer(strategy="hvdlite", max_epochs=10)
    trainer.fit(model, datamodule)

runs data-parallel under ``hvdrun -np 4 python train.py`` (or ``srun``,
``mpiexec``); ``HvdliteStrategy(...)`` takes options (compression, sharded
optimizer state, a process set, hierarchical allreduce).  Fabric gets the same
name: ``Fabric(strategy="hvdlite")`` (:class:`HvdliteFabricStrategy`).  Layers,
innermost first: :mod:`.environment` answers Lightning's questions about ranks
from hvdlite; :mod:`.collectives` gives both strategies their collectives;
:mod:`.strategy` (the Trainer's) and :mod:`.fabric` wrap the optimizers.

Only this package imports Lightning: ``import hvdlite`` and ``import
hvdlite.torch`` never do.  Install it with ``pip install hvdlite[lightning]``.
"""

from lightning.fabric.strategies import STRATEGY_REGISTRY as FABRIC_STRATEGIES
from lightning.pytorch.strategies import StrategyRegistry

from hvdlite.lightning.environment import HvdliteEnvironment
from hvdlite.lightning.fabric import HvdliteFabricStrategy
from hvdlite.lightning.strategy import HvdliteStrategy

__all__ = ["HvdliteEnvironment", "HvdliteFabricStrategy", "HvdliteStrategy"]

HvdliteStrategy.register_strategies(StrategyRegistry)
HvdliteFabricStrategy.register_strategies(FABRIC_STRATEGIES)
