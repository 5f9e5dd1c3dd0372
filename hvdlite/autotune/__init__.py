"""Autotune: the engine tunes its own fusion threshold, cycle time and paths.

With ``HVDLITE_AUTOTUNE=1`` (``HOROVOD_AUTOTUNE=1``, ``hvdrun --autotune``)
rank 0 measures throughput (bytes reduced per second over a number of training
steps) under one setting after another and lets Bayesian optimisation choose
the next, as Horovod's autotuner does; after a set number of samples every
rank keeps the best setting.  The parts, innermost first:

- :mod:`.setting`: the tuned parameters and their three-word wire form;
- :mod:`.space`: the candidate settings and their features;
- :mod:`.optimizer`: Gaussian-process Bayesian optimisation (scikit-learn);
- :mod:`.tuner`: rank 0's measuring and deciding, and the CSV sample log;
- :mod:`.link`: every rank's end of the per-cycle channel that makes all
  ranks apply the same setting in the same cycle.

What is tuned: the fusion threshold and the cycle time always; the
shared-memory allreduce path when the job's global set would use it (2-4 ranks
on one node); hierarchical allreduce when the job spans several nodes and some
node holds more than one rank (:func:`~.space.two_levels_worth_trying`),
whether or not ``HVDLITE_HIERARCHICAL_ALLREDUCE`` was set: ``init()`` then makes
its communicators.  With 16-bit compression its float16 and bfloat16 batches
still cross nodes as 16 bits, as node partial sums
(:mod:`hvdlite.engine.transports.half_two_level`).  Each of
these changes only how the agreed responses are cut and moved, which every
rank decides from the same setting, so switching between two cycles is safe.
The response cache (switching it off can only add work, and would need every
rank to drop the same cached bits mid-flight) and ``HVDLITE_OVERLAP`` (a
per-rank fact of how many cores a rank has) are not tuned.

Cross-rank contract: ``HVDLITE_AUTOTUNE`` and its numeric knobs must agree
on every rank (``init()`` checks); only rank 0 measures, decides and writes
the log.
"""

from __future__ import annotations

from .link import TuningLink
from .optimizer import BayesianOptimizer, require_scikit_learn
from .setting import Setting
from .space import SearchSpace, two_levels_worth_trying
from .tuner import SampleLog, Tuner

__all__ = [
    "TuningLink",
    "Tuner",
    "SampleLog",
    "Setting",
    "SearchSpace",
    "BayesianOptimizer",
    "require_scikit_learn",
    "prepare",
    "tuning_for",
    "two_levels_worth_trying",
]


def prepare(cfg, rank: int) -> SampleLog | None:
    """What ``init()`` checks on every rank before any collective set-up:
    scikit-learn imports (ImportError naming the fix), and rank 0 can create
    the sample log (OSError).  Returns rank 0's open log, else None."""
    require_scikit_learn()
    if rank == 0 and cfg.autotune_log:
        try:
            return SampleLog(cfg.autotune_log)
        except OSError as exc:
            raise OSError(
                f"HVDLITE_AUTOTUNE_LOG={cfg.autotune_log!r} cannot be written "
                f"({exc.strerror or exc}); give a path in a writable directory."
            ) from exc
    return None


def tuning_for(
    cfg, rank: int, world_size: int, router, hierarchical, sample_log: SampleLog | None = None
) -> TuningLink:
    """The engine's link for this rank (with the tuner on rank 0), starting from
    the knobs *cfg* the job was started with.

    *router*: the job's :class:`~hvdlite.engine.transports.routes.Router`; *hierarchical*:
    the two-level helper or None (``init()`` makes it for autotune where
    :func:`two_levels_worth_trying` says so).  Every rank derives the same start.
    """
    from ..engine.transports.routes import Transport

    start = Setting(
        cfg.fusion_threshold, cfg.cycle_time_ms, router.shared_memory, router.hierarchical_allreduce
    )
    flat = router.variant(shared_memory=True, hierarchical_allreduce=False)
    shared_memory = (
        router.shared_memory and flat.routes(range(world_size)).allreduce is Transport.SHARED_MEMORY
    )
    multi_node = hierarchical is not None and two_levels_worth_trying(
        len(node) for node in hierarchical.nodes
    )
    tuner = None
    if rank == 0:
        space = SearchSpace(start, shared_memory=shared_memory, hierarchical=multi_node)
        tuner = Tuner(
            space,
            BayesianOptimizer(space.features, cfg.autotune_gaussian_process_noise),
            warmup_samples=cfg.autotune_warmup_samples,
            steps_per_sample=cfg.autotune_steps_per_sample,
            max_samples=cfg.autotune_bayes_opt_max_samples,
            sample_log=sample_log,
        )
    return TuningLink(start, tuner)
