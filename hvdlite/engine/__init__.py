"""The engine: the background machinery behind every collective.

Nothing here is public API; users import ``hvdlite`` and its adapters.  The
modules, in the order a collective meets them (ARCHITECTURE.md walks one
gradient through them):

Negotiation
    ``submissions`` (the queue of entries from caller threads), ``auto_names``
    (names for unnamed collectives), ``messages`` (requests and responses),
    ``cycle`` (the :class:`~hvdlite.engine.cycle.Engine`: one cycle of
    negotiate, fuse, run, wiring the parts below), ``driver`` (who runs the
    next cycle, and when), ``backoff``, ``doorbell`` and ``wait_limit`` (how
    waits are paced, woken and bounded), ``cache_bits`` and ``response_cache``
    (names seen before, one bit each), ``status`` and ``status_exchange`` (the
    per-cycle status vector and its allreduce), ``negotiation`` and
    ``coordinator`` (new names, decided by rank 0), ``order_check``
    (``HVDLITE_CHECK_ORDER``: ranks that call different collectives).

Running what was agreed
    ``execution`` (batches, cached ``plans``, control responses),
    ``set_control`` (adding and removing process sets), ``staging`` (a cached
    plan's shared-memory batch copied in early), ``fusion`` (batches of ready
    responses), ``executor`` (runs a batch on the host), ``transport`` (which
    path a set's batches take), ``shm``, ``hierarchical``, ``adasum``,
    ``splits`` and ``dtypes``.

State
    ``runtime`` (what ``init()`` built; the bottom of the import graph),
    ``init_agreement``, ``initial_sets`` (the sets of ``init(process_sets=...)``),
    ``process_set_table``, ``thread_affinity``.

Imports point inward only: the public modules and the adapters import the
engine, never the reverse (``tools/import_graph.py`` checks it).
"""
