"""The engine: the background machinery behind every collective.

Nothing here is public API; users import ``hvdlite`` and its adapters.  The
modules, in the order a collective meets them (ARCHITECTURE.md walks one
gradient through them):

The loop
    ``cycle`` (the :class:`~hvdlite.engine.cycle.Engine`: one cycle of
    negotiate, fuse, run, wiring the parts below), ``in_flight`` (this rank's
    entries until they finish), ``driver`` (who runs the next cycle, and when),
    ``doorbell`` and ``wait_limit`` (how waits are woken and bounded),
    ``stop_reasons`` (why the engine stopped).

Negotiation
    ``submissions`` (the queue of entries from caller threads), ``auto_names``
    (names for unnamed collectives), ``messages`` (requests and responses),
    ``cache_bits`` and ``response_cache`` (names seen before, one bit each),
    ``status`` and ``status_exchange`` (the per-cycle status vector and its
    allreduce), ``negotiation`` and ``coordinator`` (new names, decided by rank
    0), ``order_check`` (``HVDLITE_CHECK_ORDER``: ranks that call different
    collectives).

Running what was agreed
    ``execution`` (batches, cached ``plans``, control responses), ``fusion``
    (batches of ready responses), ``executor`` (the dispatcher: each batch to the
    first transport of its set's lineup that takes it), ``set_control`` (adding
    and removing process sets), and the ``transports`` package: every path a
    batch can take, as peers (host MPI, shared memory, hierarchical, Adasum,
    NCCL, CUDA-aware MPI, staged through host memory).

State
    ``runtime`` (what ``init()`` built), ``init_agreement``, ``initial_sets``
    (the sets of ``init(process_sets=...)``), ``process_set_table``,
    ``thread_affinity``.

Imports point down only: the public modules and the adapters import the engine,
the engine imports its transports, and they import device memory
(:mod:`hvdlite.device`) and the leaves (:mod:`hvdlite.util`), never the reverse
(``tools/import_graph.py`` checks it).
"""
