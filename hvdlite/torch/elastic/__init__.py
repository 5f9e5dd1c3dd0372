"""``hvdlite.torch.elastic``: Horovod's ``horovod.torch.elastic`` (run, states, sampler).

``hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)``, ``@hvd.elastic.run``,
``hvd.elastic.ElasticSampler``; the guarantee and the cross-rank contract are in
:mod:`hvdlite.elastic`.
"""

from hvdlite.elastic import ObjectState, State, run, run_fn
from hvdlite.torch.elastic.sampler import ElasticSampler
from hvdlite.torch.elastic.state import TorchState

__all__ = ["run", "run_fn", "State", "ObjectState", "TorchState", "ElasticSampler"]
