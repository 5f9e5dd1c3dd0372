"""Knobs: every tunable of hvdlite, read once from the environment at ``init()``.

Each knob has an ``HVDLITE_*`` environment variable; the matching ``HOROVOD_*``
name is accepted too so existing job scripts keep working, and the ``HVDLITE_``
spelling wins when both are set.  ``hvdrun`` exposes every knob as a flag that
sets the variable (see :data:`KNOBS`, the single table both sides read).

Cross-rank contract: knobs are read per process, and some of them change what
ranks do together (how tensors are fused, what a response-cache bit means,
which transport a process set uses).  Those are marked ``agree=True``:
``init()`` compares every rank's values with rank 0's and fails on every rank,
naming the knob, the ranks and their values, when they differ.  The others
(cycle time, overlap, logging, timeline, stall and timeout seconds, malloc
tuning, the MPI thread level, thread affinity, the autotune log) only change this rank's timing
or output and may differ between ranks.  With autotune on, rank 0's tuned fusion threshold
and cycle time replace every rank's own (:mod:`hvdlite.autotune`).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping

__all__ = [
    "Knob",
    "KNOBS",
    "Config",
    "read_config",
    "env_value",
    "variable_of",
    "agreed_values",
    "disagreements",
]


@dataclasses.dataclass(frozen=True)
class Knob:
    """One tunable: its attribute on :class:`Config`, its variable, its type."""

    attr: str
    env: str  # the HVDLITE_ name; the HOROVOD_ name is derived from it
    kind: type
    default: object
    help: str
    agree: bool = False  # every rank must run with the same value (checked by init())

    @property
    def horovod_env(self) -> str:
        return "HOROVOD_" + self.env[len("HVDLITE_") :]


KNOBS: tuple[Knob, ...] = (
    Knob(
        "fusion_threshold",
        "HVDLITE_FUSION_THRESHOLD",
        int,
        64 * 1024 * 1024,
        "bytes: ready tensors are packed into one buffer up to this size (0 disables fusion)",
        agree=True,
    ),
    Knob(
        "cycle_time_ms",
        "HVDLITE_CYCLE_TIME",
        float,
        1.0,
        "milliseconds the engine waits after the first asynchronous submission of a burst "
        "before negotiating, so the rest of the burst is fused into the same cycle",
    ),
    Knob(
        "overlap",
        "HVDLITE_OVERLAP",
        str,
        "auto",
        "on: the engine thread negotiates asynchronous work (e.g. gradients from backward "
        "hooks) while the framework still computes; off: it leaves that to the first "
        "thread that waits on a handle (after 20 ms it starts anyway); auto: on only when "
        "this process may use more cores than there are ranks on its node, since "
        "otherwise the engine thread can only take the core from the compute",
    ),
    Knob(
        "cache_capacity",
        "HVDLITE_CACHE_CAPACITY",
        int,
        1024,
        "entries in the response cache (0 disables it: every name goes to the coordinator)",
        agree=True,
    ),
    Knob(
        "hierarchical_allreduce",
        "HVDLITE_HIERARCHICAL_ALLREDUCE",
        bool,
        False,
        "reduce-scatter inside each node, allreduce each shard across nodes, allgather inside "
        "the node (nodes of unequal size: reduce to one rank per node, allreduce across nodes, "
        "broadcast inside each node); large float16 and bfloat16 sums are summed in float32 "
        "inside each node and cross nodes as 16-bit node partial sums; reduce-scatters of "
        "the whole job on nodes of one size go through the two levels too (float16 and "
        "bfloat16 ones the same way, 16 bits across nodes)",
        agree=True,
    ),
    Knob(
        "hierarchical_allgather",
        "HVDLITE_HIERARCHICAL_ALLGATHER",
        bool,
        False,
        "gather inside each node to one rank, exchange the node blocks across nodes, "
        "broadcast the result inside each node",
        agree=True,
    ),
    Knob(
        "timeline",
        "HVDLITE_TIMELINE",
        str,
        "",
        "path of a Chrome-trace timeline written by rank 0 (empty: off)",
    ),
    Knob(
        "timeline_mark_cycles",
        "HVDLITE_TIMELINE_MARK_CYCLES",
        bool,
        False,
        "mark every engine cycle in the timeline",
    ),
    Knob(
        "stall_check_disable",
        "HVDLITE_STALL_CHECK_DISABLE",
        bool,
        False,
        "turn the stall inspector off",
    ),
    Knob(
        "stall_check_time_seconds",
        "HVDLITE_STALL_CHECK_TIME_SECONDS",
        float,
        60.0,
        "seconds a name may wait for other ranks before the coordinator warns",
    ),
    Knob(
        "stall_shutdown_time_seconds",
        "HVDLITE_STALL_SHUTDOWN_TIME_SECONDS",
        float,
        0.0,
        "seconds after which stalled collectives fail with an error on every rank "
        "(0: never; the stall inspector only warns)",
    ),
    Knob(
        "check_order",
        "HVDLITE_CHECK_ORDER",
        bool,
        False,
        "compare the order in which the ranks of each process set call collectives, and "
        "fail the first two that differ on every rank, naming both, instead of stalling "
        "(every collective then goes to the coordinator: for debugging)",
        agree=True,
    ),
    Knob(
        "collective_timeout",
        "HVDLITE_COLLECTIVE_TIMEOUT",
        float,
        0.0,
        "seconds any wait of this rank on the others may last (the engine's status "
        "exchange, a doorbell, a shared-memory barrier, a collective this rank submitted "
        "that others have not) before the whole job ends with an error naming the wait "
        "(0: wait forever)",
    ),
    Knob(
        "log_level",
        "HVDLITE_LOG_LEVEL",
        str,
        "WARNING",
        "TRACE, DEBUG, INFO, WARNING, ERROR or FATAL",
    ),
    Knob(
        "log_hide_time",
        "HVDLITE_LOG_HIDE_TIME",
        bool,
        False,
        "leave the time stamp out of hvdlite's log lines",
    ),
    Knob(
        "thread_affinity",
        "HVDLITE_THREAD_AFFINITY",
        str,
        "",
        "core ids, one per local rank (e.g. 0,8): local rank i pins its engine thread to "
        "the i-th (empty: no pinning)",
    ),
    Knob(
        "mpi_threads_disable",
        "HVDLITE_MPI_THREADS_DISABLE",
        bool,
        False,
        "initialize MPI with MPI_THREAD_SERIALIZED instead of MPI_THREAD_MULTIPLE",
    ),
    Knob(
        "malloc_tuning_disable",
        "HVDLITE_MALLOC_TUNING_DISABLE",
        bool,
        False,
        "leave glibc's malloc alone (by default init() keeps freed heap memory for reuse: "
        "mmap threshold 32 MiB, trim threshold 1 GiB, so per-step MPI and framework "
        "buffers do not page-fault every step)",
    ),
    Knob(
        "shm_allreduce_disable",
        "HVDLITE_SHM_ALLREDUCE_DISABLE",
        bool,
        False,
        "reduce and gather through MPI even where a process set's ranks share one node (by "
        "default sets of 2-4 ranks on one node allreduce, allgather and reduce-scatter "
        "through a shared-memory window)",
        agree=True,
    ),
    Knob(
        "ring_allreduce_disable",
        "HVDLITE_RING_ALLREDUCE_DISABLE",
        bool,
        False,
        "leave large allreduces across nodes to MPI's own algorithm (by default a "
        "process set whose ranks are on more than one node sums host allreduces and "
        "reduce-scatters of 1 MB or more around a ring that keeps each node's ranks "
        "together, and the hierarchical path's cross-node stage does the same)",
        agree=True,
    ),
    Knob(
        "half_sums_per_hop",
        "HVDLITE_HALF_SUMS_PER_HOP",
        bool,
        False,
        "carry float16 partial sums around the ring across nodes, rounded to float16 at "
        "every hop as NCCL, gloo and DDP's fp16 hook do: the reduce stage moves 2 bytes "
        "per value on each host's one ring edge, so a float16 allreduce sends about half "
        "what float32 does; results may then differ from the float32 sum rounded once (the "
        "default rule) by up to one rounding per rank",
        agree=True,
    ),
    Knob(
        "dynamic_process_sets",
        "HVDLITE_DYNAMIC_PROCESS_SETS",
        bool,
        False,
        "allow add_process_set()/remove_process_set() after init()",
        agree=True,
    ),
    Knob(
        "bucket_cap_mb",
        "HVDLITE_BUCKET_CAP_MB",
        float,
        25.0,
        "MB of gradients the torch DistributedOptimizer reduces as one grouped allreduce "
        "(a bucket; where its hooks start reductions during backward, the last layers' "
        "first bucket is at most 1 MB); 0: one allreduce per "
        "gradient, as Horovod does (the optimizer's bucket_cap_mb= argument wins; the "
        "TensorFlow optimizers already reduce a step's gradients in one submission)",
        agree=True,
    ),
    Knob(
        "autotune",
        "HVDLITE_AUTOTUNE",
        bool,
        False,
        "tune the fusion threshold, cycle time and (where this job can switch them) the "
        "shared-memory and hierarchical allreduce paths by Bayesian optimisation of the "
        "measured throughput; rank 0 decides for every rank (needs scikit-learn)",
        agree=True,
    ),
    Knob(
        "autotune_log",
        "HVDLITE_AUTOTUNE_LOG",
        str,
        "",
        "path of a CSV file rank 0 writes one row per autotune sample to (empty: none)",
    ),
    Knob(
        "autotune_warmup_samples",
        "HVDLITE_AUTOTUNE_WARMUP_SAMPLES",
        int,
        3,
        "autotune samples measured but not scored at the start (>= 0)",
        agree=True,
    ),
    Knob(
        "autotune_steps_per_sample",
        "HVDLITE_AUTOTUNE_STEPS_PER_SAMPLE",
        int,
        10,
        "training steps (rounds of the same collectives) per autotune sample (>= 1)",
        agree=True,
    ),
    Knob(
        "autotune_bayes_opt_max_samples",
        "HVDLITE_AUTOTUNE_BAYES_OPT_MAX_SAMPLES",
        int,
        20,
        "scored autotune samples before the best setting is kept for good (>= 1)",
        agree=True,
    ),
    Knob(
        "autotune_gaussian_process_noise",
        "HVDLITE_AUTOTUNE_GAUSSIAN_PROCESS_NOISE",
        float,
        0.8,
        "share of the scores' variance autotune's model puts down to noise (> 0; "
        "higher: trust one sample less)",
        agree=True,
    ),
    Knob(
        "test_node_size",
        "HVDLITE_TEST_NODE_SIZE",
        int,
        0,
        "tests and benchmarks only: group consecutive ranks into simulated nodes of this size",
        agree=True,
    ),
)

_TRUE = {"1", "true", "yes", "on", "y", "t"}
_FALSE = {"0", "false", "no", "off", "n", "f", ""}


def env_value(knob: Knob, environ: Mapping[str, str] | None = None) -> str | None:
    """The raw string for *knob*: HVDLITE_ first, then HOROVOD_, else None."""
    environ = os.environ if environ is None else environ
    for name in (knob.env, knob.horovod_env):
        if name in environ:
            return environ[name]
    return None


def variable_of(attr: str, environ: Mapping[str, str] | None = None) -> str:
    """The variable that set knob *attr*: its ``HVDLITE_*`` name unless only the
    ``HOROVOD_*`` one is set (for messages that name where a value came from)."""
    environ = os.environ if environ is None else environ
    knob = next(k for k in KNOBS if k.attr == attr)
    if knob.env not in environ and knob.horovod_env in environ:
        return knob.horovod_env
    return knob.env


def _parse(knob: Knob, raw: str):
    name = knob.env
    text = raw.strip()
    want = {bool: "0 or 1", int: "an integer", float: "a finite number"}.get(knob.kind, "a string")
    try:
        if knob.kind is bool:
            low = text.lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise ValueError(raw)
        if knob.kind in (int, float):
            if not text:
                return knob.default
            number = float(text)
            if not math.isfinite(number):
                raise ValueError(raw)
            return int(number) if knob.kind is int else number
        return text
    except (ValueError, OverflowError):
        raise ValueError(f"{name}={raw!r} is not valid: it must be {want} ({knob.help}).") from None


@dataclasses.dataclass(frozen=True)
class Config:
    """The knob values one process runs with (immutable; made by :func:`read_config`)."""

    fusion_threshold: int = 64 * 1024 * 1024
    cycle_time_ms: float = 1.0
    overlap: str = "auto"
    cache_capacity: int = 1024
    hierarchical_allreduce: bool = False
    hierarchical_allgather: bool = False
    timeline: str = ""
    timeline_mark_cycles: bool = False
    stall_check_disable: bool = False
    stall_check_time_seconds: float = 60.0
    stall_shutdown_time_seconds: float = 0.0
    log_level: str = "WARNING"
    mpi_threads_disable: bool = False
    malloc_tuning_disable: bool = False
    shm_allreduce_disable: bool = False
    ring_allreduce_disable: bool = False
    half_sums_per_hop: bool = False
    dynamic_process_sets: bool = False
    test_node_size: int = 0
    check_order: bool = False
    collective_timeout: float = 0.0
    log_hide_time: bool = False
    thread_affinity: str = ""
    bucket_cap_mb: float = 25.0
    autotune: bool = False
    autotune_log: str = ""
    autotune_warmup_samples: int = 3
    autotune_steps_per_sample: int = 10
    autotune_bayes_opt_max_samples: int = 20
    autotune_gaussian_process_noise: float = 0.8


def read_config(environ: Mapping[str, str] | None = None) -> Config:
    """Read every knob from *environ* (default ``os.environ``); bad values raise ValueError."""
    values = {}
    for knob in KNOBS:
        raw = env_value(knob, environ)
        if raw is not None:
            values[knob.attr] = _parse(knob, raw)
    cfg = Config(**values)
    if cfg.fusion_threshold < 0:
        raise ValueError("HVDLITE_FUSION_THRESHOLD must be >= 0 bytes (0 disables fusion).")
    if not 0 < cfg.cycle_time_ms <= 10_000:
        raise ValueError(
            "HVDLITE_CYCLE_TIME must be a positive number of milliseconds, "
            "at most 10000 (typical: 1 to 5)."
        )
    if cfg.cache_capacity < 0:
        raise ValueError("HVDLITE_CACHE_CAPACITY must be >= 0 (0 disables the response cache).")
    if cfg.test_node_size < 0:
        raise ValueError("HVDLITE_TEST_NODE_SIZE must be >= 0.")
    if cfg.bucket_cap_mb < 0:
        raise ValueError("HVDLITE_BUCKET_CAP_MB must be >= 0 MB (0: one allreduce per gradient).")
    for attr, env in (
        ("stall_check_time_seconds", "HVDLITE_STALL_CHECK_TIME_SECONDS"),
        ("stall_shutdown_time_seconds", "HVDLITE_STALL_SHUTDOWN_TIME_SECONDS"),
        ("collective_timeout", "HVDLITE_COLLECTIVE_TIMEOUT"),
    ):
        if getattr(cfg, attr) < 0:
            raise ValueError(f"{env} must be >= 0 seconds (0 turns it off).")
    _check_autotune(cfg)
    cores = [part.strip() for part in cfg.thread_affinity.split(",")]
    if cfg.thread_affinity.strip() and not all(part.isdigit() for part in cores):
        raise ValueError(
            f"HVDLITE_THREAD_AFFINITY={cfg.thread_affinity!r} is not valid: give "
            "one core id per local rank, e.g. 0,8 for two ranks per node."
        )
    overlap = cfg.overlap.strip().lower()
    overlap = {
        "1": "on",
        "true": "on",
        "yes": "on",
        "0": "off",
        "false": "off",
        "no": "off",
        "": "auto",
    }.get(overlap, overlap)
    if overlap not in ("auto", "on", "off"):
        raise ValueError(f"HVDLITE_OVERLAP={cfg.overlap!r} is not valid: use auto, on or off.")
    cfg = dataclasses.replace(cfg, overlap=overlap)
    levels = {"TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL"}
    if cfg.log_level.upper() not in levels:
        raise ValueError(
            f"HVDLITE_LOG_LEVEL={cfg.log_level!r} is not valid: use one of {sorted(levels)}."
        )
    return dataclasses.replace(cfg, log_level=cfg.log_level.upper())


def _check_autotune(cfg: Config) -> None:
    for attr, env, low, what in (
        ("autotune_warmup_samples", "HVDLITE_AUTOTUNE_WARMUP_SAMPLES", 0, ">= 0"),
        ("autotune_steps_per_sample", "HVDLITE_AUTOTUNE_STEPS_PER_SAMPLE", 1, ">= 1"),
        ("autotune_bayes_opt_max_samples", "HVDLITE_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", 1, ">= 1"),
    ):
        if getattr(cfg, attr) < low:
            raise ValueError(
                f"{env}={getattr(cfg, attr)} is not valid: it must be {what} "
                "(Horovod's defaults: 3 warmup samples, 10 steps per sample, "
                "20 samples)."
            )
    if not cfg.autotune_gaussian_process_noise > 0:
        raise ValueError(
            f"HVDLITE_AUTOTUNE_GAUSSIAN_PROCESS_NOISE="
            f"{cfg.autotune_gaussian_process_noise} is not valid: it must be more "
            "than 0 (default 0.8; lower trusts each sample more)."
        )


def agreed_values(cfg: Config) -> tuple:
    """The values of the knobs every rank must share, in :data:`KNOBS` order."""
    return tuple(getattr(cfg, k.attr) for k in KNOBS if k.agree)


def disagreements(per_rank: list[tuple]) -> list[str]:
    """One line per ``agree`` knob whose value differs between ranks.

    *per_rank*: :func:`agreed_values` of every rank, indexed by rank.  Each line
    names the knob, and which ranks run with which value.
    """
    knobs = [k for k in KNOBS if k.agree]
    lines = []
    for i, knob in enumerate(knobs):
        by_value: dict = {}
        for rank, values in enumerate(per_rank):
            by_value.setdefault(values[i], []).append(rank)
        if len(by_value) > 1:
            parts = "; ".join(
                f"rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))}: {value!r}"
                for value, r in by_value.items()
            )
            lines.append(f"{knob.env} differs between ranks ({parts})")
    return lines
