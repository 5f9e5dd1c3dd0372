"""``horovod.common``: ``exceptions``, ``basics``, ``process_sets`` and ``elastic`` are
hvdlite's modules of those names (served by the finder in ``horovod/__init__.py``);
``util`` is here."""
