"""``hvdlite.torch``: Horovod's ``horovod.torch`` API on hvdlite's engine.

Switch a Horovod script by changing ``import horovod.torch as hvd`` to
``import hvdlite.torch as hvd``.  Layers, innermost first:

- :mod:`._handles` turns CPU tensors into zero-copy numpy views for the
  engine and engine results back into tensors;
- :mod:`.mpi_ops` is every collective in Horovod's spellings (async, in-place,
  grouped, differentiable);
- :mod:`.compression` (stateless casts), :mod:`.compressors` (top-k and
  PowerSGD, stateful), :mod:`.optimizer` (``DistributedOptimizer``, with
  :mod:`.adasum_optimizer` for ``op=Adasum``), :mod:`.functions` (broadcast
  helpers) and :mod:`.sync_batch_norm` build on it.

The basics (``init``, ``rank``, process sets, reduce ops, errors) are the
engine's own objects, re-exported so ``hvd.init()`` etc. work unchanged.
Cross-rank contracts are stated on each function.
"""

from hvdlite.common import *  # the basics every adapter re-exports, listed once
from hvdlite.common import __all__ as _common_names
from hvdlite.exceptions import (
    ArgumentError,
    CollectiveTimeoutError,
    HostsUpdatedInterrupt,
    MismatchError,
)
from hvdlite.torch.compression import Compression
from hvdlite.torch.functions import (
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from hvdlite.torch.mpi_ops import (
    allgather,
    allgather_async,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall,
    alltoall_async,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter,
    grouped_reducescatter_async,
    join,
    poll,
    reducescatter,
    reducescatter_async,
    sparse_allreduce_async,
    synchronize,
)
from hvdlite.torch.optimizer import DistributedOptimizer
from hvdlite.torch.reducers import (
    AdasumReducer,
    AllreduceReducer,
    CompressorReducer,
    GradientReducer,
    ReductionContext,
)
from hvdlite.torch.sharded_amp import ShardedGradScaler
from hvdlite.torch.sync_batch_norm import SyncBatchNorm
from hvdlite.torch import elastic  # noqa: E402 - hvd.elastic.TorchState, as in Horovod

from hvdlite.torch.mpi_ops import __all__ as _mpi_ops_all

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
    "ShardedGradScaler",
    "broadcast_parameters",
    "broadcast_optimizer_state",
    "broadcast_object",
    "allgather_object",
    "SyncBatchNorm",
    # gradient reducers for DistributedOptimizer(reducer=...)
    "GradientReducer",
    "ReductionContext",
    "AllreduceReducer",
    "CompressorReducer",
    "AdasumReducer",
    # elastic training (hvd.elastic.run, TorchState, ElasticSampler)
    "elastic",
]
