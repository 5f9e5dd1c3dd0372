"""Leaf helpers that any layer may use and that import nothing of hvdlite above them.

- :mod:`~hvdlite.util.dtypes`: which dtypes the engine moves, and the wire dtype
  each is reduced in;
- :mod:`~hvdlite.util.splits`: even splits of rows over ranks, and offsets;
- :mod:`~hvdlite.util.backoff`: the one waiting policy for every thread that polls;
- :mod:`~hvdlite.util.safe_files`: opening an output file without following a
  link (standard library only: the launcher's task wrapper loads it as a plain
  file);
- :mod:`~hvdlite.util.paths`: the names of the paths a batch can take.

Nothing here talks to another rank.
"""
