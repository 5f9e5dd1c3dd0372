"""Run every benchmark in this folder, one after the other (``make bench``).

Each benchmark starts its own MPI job and prints its figures beside the
baselines it measured in the same run, as ratios.  A failing benchmark is
reported and the others still run; the exit code says whether all succeeded.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    names = argv or sorted(p.name for p in HERE.glob("bench_*.py"))
    failed = []
    for name in names:
        path = HERE / name
        print(f"\n=== {name} ===", flush=True)
        start = time.perf_counter()
        rc = subprocess.run([sys.executable, str(path)]).returncode
        print(f"--- {name}: exit {rc}, {time.perf_counter() - start:.0f} s", flush=True)
        if rc:
            failed.append(name)
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
