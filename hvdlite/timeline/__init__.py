"""A phase-level timeline of the engine, as a Chrome trace (Perfetto, chrome://tracing).

Rank 0 writes it: ``HVDLITE_TIMELINE=path`` (``hvdrun --timeline-filename``) from
``init()``, or ``hvd.start_timeline(path, mark_cycles=False)`` /
``hvd.stop_timeline()`` at run time.  The modules, from the engine outwards:

- ``schema``: the trace's vocabulary (phases, tracks) and the engine's records;
- ``recorder``: :class:`Timeline`, the object the engine calls; it only appends
  tuples to a bounded queue;
- ``events`` and ``writer``: the timeline's own thread turns the tuples into
  trace lines and writes whole lines, so a cut file still loads;
- ``steps``: what a framework's optimizer calls to draw each training step's
  backward pass and ``synchronize()`` (from the training thread);
- ``reader``, ``summary``, ``overlap``, ``plot``: reading a file back
  (``python -m hvdlite.timeline summary|overlap|plot FILE``).
"""

from .reader import Trace, load
from .recorder import MAX_ROWS, Timeline

__all__ = ["Timeline", "MAX_ROWS", "Trace", "load"]
