"""Collectives on picklable Python objects, built on the array collectives.

Objects travel as pickled uint8 arrays; never use these on the data path.
Cross-rank contract: as for the array collectives (same names, same order).
Every rank unpickles what the others send, and unpickling runs code the sender
chose: the ranks of a job must trust each other, as in any MPI job.
"""

from __future__ import annotations

import io
import pickle

import numpy as np

from .runtime import state
from .collectives import _name, allgather, broadcast
from .process_sets import global_process_set

__all__ = ["broadcast_object", "allgather_object"]


def _set_id(process_set) -> int:
    return getattr(process_set, "process_set_id", None) or 0


def _dumps(obj) -> np.ndarray:
    buf = io.BytesIO()
    pickle.dump(obj, buf, protocol=pickle.HIGHEST_PROTOCOL)
    return np.frombuffer(buf.getbuffer(), dtype=np.uint8).copy()


def broadcast_object(obj, root_rank: int = 0, name: str | None = None,
                     process_set=global_process_set):
    """Return *obj* from *root_rank* on every rank of the set (other ranks' obj is ignored).

    Unpickles what other ranks send: the ranks must trust each other, as in any MPI job.
    """
    st = state()
    name = _name(st, "broadcast_object", name, _set_id(process_set))
    is_root = st.world.Get_rank() == int(root_rank)
    payload = _dumps(obj) if is_root else np.empty(0, dtype=np.uint8)
    length = np.array([payload.size], dtype=np.int64)
    length = broadcast(length, root_rank, name=f"{name}.size", process_set=process_set)
    if not is_root:
        payload = np.empty(int(length[0]), dtype=np.uint8)
    data = broadcast(payload, root_rank, name=f"{name}.data", process_set=process_set)
    return obj if is_root else pickle.loads(data.tobytes())


def allgather_object(obj, name: str | None = None, process_set=global_process_set) -> list:
    """Return the list of every rank's *obj*, ordered by rank within the set.

    Unpickles what other ranks send: the ranks must trust each other, as in any MPI job.
    """
    st = state()
    name = _name(st, "allgather_object", name, _set_id(process_set))
    payload = _dumps(obj)
    sizes = allgather(np.array([payload.size], dtype=np.int64), name=f"{name}.sizes",
                      process_set=process_set)
    data = allgather(payload, name=f"{name}.data", process_set=process_set)
    out, offset = [], 0
    for n in sizes.tolist():
        out.append(pickle.loads(data[offset:offset + n].tobytes()))
        offset += n
    return out
