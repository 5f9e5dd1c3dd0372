"""The engine: the background machinery behind every collective.

Nothing here is public API; users import ``hvdlite`` and its adapters.  The
modules, in the order a collective meets them (ARCHITECTURE.md walks one
gradient through them):

Negotiation
    ``submissions`` (the queue of entries from caller threads), ``auto_names``
    (names for unnamed collectives), ``messages`` (requests and responses),
    ``cycle`` (the :class:`~hvdlite.engine.cycle.Engine`: one cycle of
    negotiate, fuse, run), ``driver`` (who runs the next cycle, and when),
    ``backoff``, ``doorbell`` and ``wait_limit`` (how waits are paced, woken and
    bounded), ``cache_bits`` and ``response_cache`` (names seen before, one bit
    each), ``status`` (the per-cycle status vector), ``coordinator`` (rank 0's
    decisions for new names), ``plans`` (fusion plans remembered per set of
    ready bits), ``staging`` (a cached plan's shared-memory batch copied in
    early).

Data path
    ``fusion`` (batches of ready responses), ``executor`` (runs a batch on the
    host), ``transport`` (which path a set's batches take), ``shm``,
    ``hierarchical``, ``adasum``, ``splits`` and ``dtypes``.

State
    ``runtime`` (what ``init()`` built; the bottom of the import graph),
    ``init_agreement``, ``process_set_table``, ``thread_affinity``.

Imports point inward only: the public modules and the adapters import the
engine, never the reverse (``tools/import_graph.py`` checks it).
"""
