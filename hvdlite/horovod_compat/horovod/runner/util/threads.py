"""``horovod.runner.util.threads``."""

from __future__ import annotations

import threading

__all__ = ["in_thread"]


def in_thread(target, args=(), name=None, daemon=True, silent=False) -> threading.Thread:
    """Run *target* in a new (daemon) thread and return the thread."""
    thread = threading.Thread(target=target, args=args, name=name, daemon=daemon)
    thread.start()
    return thread
