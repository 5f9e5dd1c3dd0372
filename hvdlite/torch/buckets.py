"""Gradient buckets: which parameters a DistributedOptimizer reduces together.

As PyTorch DDP does, the trainable parameters are taken in reverse
registration order (roughly the order backward produces their gradients) and
cut into buckets of at most ``cap`` bytes; where the reductions start during
backward, the first bucket is smaller (:data:`FIRST_BUCKET_BYTES`) so that
communication starts early.  Where they all start at ``synchronize()`` (the
hooks only count), a small first bucket would only cost one more collective.
A bucket goes to the engine as one grouped allreduce when its last gradient is
final, so the engine negotiates a handful of entries per step instead of one
per parameter.  Grouping never changes the result: an allreduce is element-wise,
and each gradient keeps its own compression and scaling.

Cross-rank contract: the buckets follow only from the parameters' order, sizes
and dtypes, from ``cap`` and from whether the hooks start work (agreed at
``init()``), so ranks that wrap the same model with the same
cap build the same buckets.  ``init()`` checks that every rank has the same
``HVDLITE_BUCKET_CAP_MB``; a rank passing another ``bucket_cap_mb=`` names its
buckets differently, and the stall inspector reports the names the others wait
for.
"""

from __future__ import annotations

from hvdlite import basics

__all__ = ["bucket_cap_bytes", "build_buckets", "FIRST_BUCKET_BYTES"]

#: The first bucket (the last layers' gradients, ready first) is at most this big.
FIRST_BUCKET_BYTES = 1 << 20


def bucket_cap_bytes(bucket_cap_mb) -> int:
    """The bucket capacity in bytes: the argument, else the ``HVDLITE_BUCKET_CAP_MB``
    knob read at ``init()`` (default 25; every rank must run with the same); 0
    turns buckets off (one allreduce per gradient, as Horovod does)."""
    if bucket_cap_mb is None:
        return int(basics.job_config().bucket_cap_mb * (1 << 20))
    if (
        isinstance(bucket_cap_mb, bool)
        or not isinstance(bucket_cap_mb, (int, float))
        or not 0 <= bucket_cap_mb < float("inf")
    ):
        raise ValueError(
            f"bucket_cap_mb must be a finite number of MB >= 0 (0: one "
            f"allreduce per gradient), got {bucket_cap_mb!r}"
        )
    return int(bucket_cap_mb * (1 << 20))


def build_buckets(params, cap: int, first: int = FIRST_BUCKET_BYTES) -> list[tuple]:
    """Cut *params* (in registration order) into buckets, last parameter first,
    the first bucket at most *first* bytes (and *cap*).

    Returns tuples of two or more parameters; a parameter alone in its bucket
    (bigger than the cap, or the only one left) is not listed and is reduced on
    its own.  ``cap`` 0 gives no buckets."""
    if cap <= 0:
        return []
    buckets, current, size = [], [], 0
    limit = min(cap, first)
    for p in reversed(list(params)):
        nbytes = p.numel() * p.element_size()
        if current and size + nbytes > limit:
            buckets.append(current)
            current, size, limit = [], 0, cap
        current.append(p)
        size += nbytes
    if current:
        buckets.append(current)
    return [tuple(bucket) for bucket in buckets if len(bucket) > 1]
