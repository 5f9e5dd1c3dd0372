"""Elastic training: jobs that survive lost ranks and take in new hosts (Horovod's API).

Layers, innermost first:

- :mod:`.layout` -- what hvdrun and the ranks share: variables, the files in
  the job's state directory, exit codes (standard library only: hvdrun uses it);
- :mod:`.persistence` -- the commit file: atomic write (spare file, fsync,
  rename), validated read (:mod:`.checksum`);
- :mod:`.state` -- :class:`State` and :class:`ObjectState`: save, commit,
  restore, sync, host-update checks, reset callbacks;
- :mod:`.run` -- the ``run`` decorator: resume from the last commit, sync,
  run the function, leave for a relaunch when hosts change.

The framework modules (``hvdlite.torch.elastic``, ``hvdlite.tensorflow.elastic``,
``hvdlite.tensorflow.keras.elastic``) add their states on top.  hvdrun's side
(the relaunch loop, host discovery, blacklist) is in :mod:`hvdlite.runner`.

The guarantee, under ``hvdrun`` with an elastic option: a rank that dies costs
the work since the last ``commit()`` that returned, never more (``commit()``
returns on every rank once the commit is on disk); a host change costs nothing
(the state is committed before the ranks leave).  With background commit
writes (``HVDLITE_ELASTIC_BACKGROUND_COMMIT=1``) a failure that ends rank 0
while it writes loses the last commit too (:mod:`.writer`).  What a commit
holds is what the state tracks -- anything else (a data loader's position
outside an ElasticSampler, random generators' states) starts afresh.
"""

from ..exceptions import HorovodInternalError, HostsUpdatedInterrupt
from .layout import HOSTS_UPDATED_EXIT, STATE_ERROR_EXIT
from .persistence import ElasticStateError
from .run import run, run_fn
from .state import ObjectState, State

__all__ = [
    "State",
    "ObjectState",
    "run",
    "run_fn",
    "ElasticStateError",
    "HostsUpdatedInterrupt",
    "HorovodInternalError",
    "HOSTS_UPDATED_EXIT",
    "STATE_ERROR_EXIT",
]
