"""Automatic names for collectives called without ``name=``.

Ranks pair up collectives by name, so an automatic name must come out the same
on every rank for the same call.  Each thread counts its own calls per
operation (and process set): the main thread's names are ``<op>.noname.<n>``,
another thread's ``<op>.noname.<thread name>.<n>``.  Threads never share a
counter, so two threads cannot get the same name or shift each other's
numbering, and a program whose threads have the same names on every rank and
submit in the same order per thread gets the same names everywhere.

Cross-rank contract: threads that submit unnamed collectives carry the same
names on every rank (Python's default ``Thread-N`` names qualify when ranks
start their threads in the same order).  Two live threads of one process with
the same name cannot both submit unnamed collectives: the second gets a
ValueError naming the fix.
"""

from __future__ import annotations

import threading
import weakref

__all__ = ["AutoNames"]


class AutoNames:
    """Per-thread call counters of one hvdlite run (``init()`` makes a new one)."""

    def __init__(self):
        self._local = threading.local()
        self._lock = threading.Lock()
        self._threads: dict[str, weakref.ref] = {}  # thread name -> its live thread

    def suffix(self, key) -> str:
        """The next number of *key* in this thread, prefixed by the thread's name
        outside the main thread."""
        counters = getattr(self._local, "counters", None)
        if counters is None:
            counters = self._enroll()
        n = counters.get(key, 0)
        counters[key] = n + 1
        prefix = self._local.prefix
        return str(n) if prefix is None else f"{prefix}.{n}"

    def _enroll(self) -> dict:
        thread = threading.current_thread()
        prefix = None
        if thread is not threading.main_thread():
            prefix = thread.name
            with self._lock:
                holder = self._threads.get(prefix)
                other = holder() if holder is not None else None
                if other is not None and other is not thread and other.is_alive():
                    raise ValueError(
                        f"Two threads named {prefix!r} submit collectives without name=; "
                        "automatic names are counted per thread name, so give each "
                        "submitting thread a distinct name (threading.Thread(name=...)) or "
                        "pass name= to every collective."
                    )
                self._threads[prefix] = weakref.ref(thread)
        self._local.prefix = prefix
        self._local.counters = {}
        return self._local.counters
