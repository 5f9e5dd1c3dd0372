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

from hvdlite.basics import (
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    rocm_built,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from hvdlite.dynamic_sets import add_process_set, remove_process_set
from hvdlite.exceptions import (
    ArgumentError,
    CollectiveTimeoutError,
    HorovodInternalError,
    HostsUpdatedInterrupt,
    MismatchError,
)
from hvdlite.ops import Adasum, Average, Max, Min, Product, Sum
from hvdlite.process_sets import ProcessSet, global_process_set
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

from hvdlite.basics import COMMON_NAMES
from hvdlite.jax.mpi_ops import __all__ as _mpi_ops_all

__all__ = [
    *COMMON_NAMES,
    "HorovodInternalError",
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
