"""hvdlite: Horovod's API for data-parallel training, in pure Python over MPI.

Layers, from the outside in (imports only point inward; ``make lint`` and a
test check the layering and that hvdlite's modules import no cycle):

- framework adapters: ``hvdlite.torch``, ``hvdlite.tensorflow`` (and ``.keras``),
  which turn tensors into numpy views and wrap optimizers; they import the
  public modules they use (``collectives``, ``handles``, ``basics``...) by name;
- this package's public API, the modules at its top level: basics (init,
  ranks), process sets, the collectives on numpy arrays (``hvdlite.allreduce``
  ...), handles, ops, exceptions, config, plus :func:`DistributedOptimizer`,
  which dispatches on the optimizer's framework;
- the engine (``hvdlite.engine``): the cycle that negotiates readiness with
  rank 0 or through the response cache, fuses ready tensors and runs them on
  the path the set's transport names; at its bottom, ``runtime``, the live
  state that ``init()`` builds;
- the device path (``hvdlite.device``): the same batches on GPU buffers.

ARCHITECTURE.md follows one gradient through these modules.

Importing hvdlite imports neither torch nor tensorflow, and does not initialize
MPI until :func:`init` is called.
"""

from .basics import *  # the basics, listed once in basics.__all__
from .basics import __all__ as _BASICS
from .exceptions import (
    ArgumentError,
    CollectiveTimeoutError,
    HorovodInternalError,
    HostsUpdatedInterrupt,
    HvdliteInternalError,
    MismatchError,
)
from .handles import Handle, poll, synchronize
from .ops import HANDLES as _HANDLES
from .ops import Adasum, Average, Max, Min, Product, ReduceOp, Sum
from .process_sets import ProcessSet, global_process_set
from .version import __version__


def __getattr__(name):
    # The collectives import numpy: load them on first use, so `import hvdlite`
    # (which hvdrun does too) stays light.
    import importlib

    if name == "run":  # horovod.run: a function on every rank of a new job (imports no MPI)
        from .runner import run

        return run
    for module_name in ("hvdlite.collectives", "hvdlite.objects", "hvdlite.dynamic_sets"):
        module = importlib.import_module(module_name)
        if name in module.__all__:
            value = getattr(module, name)
            globals()[name] = value
            return value
    if name == "DistributedOptimizer":
        from ._dispatch import DistributedOptimizer

        return DistributedOptimizer
    raise AttributeError(f"module 'hvdlite' has no attribute {name!r}")


__all__ = [
    *_BASICS,
    "add_process_set",
    "remove_process_set",
    "ProcessSet",
    "global_process_set",
    "HorovodInternalError",
    "ArgumentError",
    "CollectiveTimeoutError",
    "MismatchError",
    "HostsUpdatedInterrupt",
    "HvdliteInternalError",
    "Handle",
    "poll",
    "synchronize",
    "ReduceOp",
    *_HANDLES,
    "__version__",
    "allreduce",
    "allreduce_async",
    "grouped_allreduce",
    "grouped_allreduce_async",
    "allgather",
    "allgather_async",
    "grouped_allgather",
    "grouped_allgather_async",
    "broadcast",
    "broadcast_async",
    "alltoall",
    "alltoall_async",
    "reducescatter",
    "reducescatter_async",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "barrier",
    "join",
    "broadcast_object",
    "allgather_object",
    "DistributedOptimizer",
    "run",
]
