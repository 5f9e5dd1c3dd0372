"""``hvdlite.jax``: a Horovod-style API for JAX arrays and optax (+).

Use it as ``import hvdlite.jax as hvd``: ``hvd.init()``, ``hvd.rank()``,
``hvd.allreduce(x)``, ``params = hvd.broadcast_parameters(params, 0)``,
``tx = hvd.DistributedOptimizer(optax.adam(1e-3))``.  Layers, innermost first:

- :mod:`._arrays` turns JAX arrays into the engine's arrays (a zero-copy host
  view on the CPU; :mod:`._device`: CuPy views through DLPack on a GPU) and
  results back into JAX arrays on the input's device;
- :mod:`._traced` runs collectives on traced values, inside ``jax.jit``, as
  ordered host callbacks;
- :mod:`.mpi_ops` is every collective in Horovod's spellings (async and
  grouped forms; pytrees as one fused group), eagerly or inside jit;
- :mod:`.compression`, :mod:`.optimizer` (``DistributedOptimizer`` for optax)
  and :mod:`.functions` (broadcast helpers) build on it.

The basics (``init``, ``rank``, process sets, reduce ops, errors) are the
engine's own objects, re-exported.  Cross-rank contracts are stated on each
function.  Importing ``hvdlite`` does not import this package, nor JAX.
"""

from hvdlite.common import *  # the basics every adapter re-exports, listed once
from hvdlite.common import __all__ as _common_names
from hvdlite.exceptions import (
    ArgumentError,
    CollectiveTimeoutError,
    HostsUpdatedInterrupt,
    MismatchError,
)
from hvdlite.jax.compression import Compression
from hvdlite.jax.functions import allgather_object, broadcast_object, broadcast_parameters
from hvdlite.jax.mpi_ops import (
    allgather,
    allgather_async,
    allreduce,
    allreduce_async,
    alltoall,
    alltoall_async,
    barrier,
    broadcast,
    broadcast_async,
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_async,
    grouped_reducescatter,
    grouped_reducescatter_async,
    join,
    poll,
    reducescatter,
    reducescatter_async,
    synchronize,
)
from hvdlite.jax.optimizer import DistributedOptimizer

from hvdlite.jax.mpi_ops import __all__ as _mpi_ops_all

__all__ = [
    *_common_names,
    "HostsUpdatedInterrupt",
    "ArgumentError",
    "CollectiveTimeoutError",
    "MismatchError",
    # collectives
    *_mpi_ops_all,
    # training helpers
    "Compression",
    "DistributedOptimizer",
    "broadcast_parameters",
    "broadcast_object",
    "allgather_object",
]
