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

from .engine.runtime import state
from ._checks import next_name
from .collectives import allgather, broadcast
from .process_sets import global_process_set

__all__ = ["broadcast_object", "allgather_object"]


_LENGTH = 8  # bytes: the pickle's length, first in the head
_INLINE = 1024  # bytes of the pickle that travel in the head


def _set_id(process_set) -> int:
    return getattr(process_set, "process_set_id", None) or 0


def _dumps(obj) -> np.ndarray:
    buf = io.BytesIO()
    pickle.dump(obj, buf, protocol=pickle.HIGHEST_PROTOCOL)
    return np.frombuffer(buf.getbuffer(), dtype=np.uint8).copy()


def broadcast_object(
    obj, root_rank: int = 0, name: str | None = None, process_set=global_process_set
):
    """Return *obj* from *root_rank* on every rank of the set (other ranks' obj is ignored).

    One broadcast for a small object (a pickle of up to 1 KiB travels with its
    length), two for a larger one.  Unpickles what other ranks send: the ranks
    must trust each other, as in any MPI job.
    """
    st = state()
    name = next_name(st, "broadcast_object", name, _set_id(process_set))
    is_root = st.world.Get_rank() == int(root_rank)
    head = np.zeros(_LENGTH + _INLINE, dtype=np.uint8)
    if is_root:
        payload = _dumps(obj)
        head[:_LENGTH].view(np.int64)[0] = payload.size
        inline = payload[:_INLINE]
        head[_LENGTH : _LENGTH + inline.size] = inline
    head = broadcast(head, root_rank, name=f"{name}.head", process_set=process_set)
    if is_root:
        if payload.size > _INLINE:
            broadcast(payload[_INLINE:], root_rank, name=f"{name}.rest", process_set=process_set)
        return obj
    length = int(head[:_LENGTH].view(np.int64)[0])
    data = head[_LENGTH : _LENGTH + length]
    if length > _INLINE:
        rest = broadcast(
            np.empty(length - _INLINE, dtype=np.uint8),
            root_rank,
            name=f"{name}.rest",
            process_set=process_set,
        )
        data = np.concatenate([data, rest])
    return pickle.loads(data.tobytes())


def allgather_object(obj, name: str | None = None, process_set=global_process_set) -> list:
    """Return the list of every rank's *obj*, ordered by rank within the set.

    Unpickles what other ranks send: the ranks must trust each other, as in any MPI job.
    """
    st = state()
    name = next_name(st, "allgather_object", name, _set_id(process_set))
    payload = _dumps(obj)
    sizes = allgather(
        np.array([payload.size], dtype=np.int64), name=f"{name}.sizes", process_set=process_set
    )
    data = allgather(payload, name=f"{name}.data", process_set=process_set)
    out, offset = [], 0
    for n in sizes.tolist():
        out.append(pickle.loads(data[offset : offset + n].tobytes()))
        offset += n
    return out
