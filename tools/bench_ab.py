"""A/B: run benchmarks of this tree and of an earlier revision, taking turns.

``python tools/bench_ab.py BASE [bench_core.py ...] [--rounds N]`` checks out
revision BASE (a commit, a branch) into a temporary worktree and runs each named
benchmark (default: bench_core.py, bench_torch_ops.py, bench_shm_staged.py)
from that tree and from this one, alternating, *rounds* times, starting with a
different side each round.  Every benchmark prints its figures beside
baselines measured in the same job (raw mpi4py, torch DDP ...), so the two
sides' ratios compare even when the machine's speed drifts between jobs.

For a refactoring that must not change speed (``make bench`` before and after):
read each figure of the two sides together.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ["bench_core.py", "bench_torch_ops.py", "bench_shm_staged.py"]


def run(tree: Path, bench: str) -> str:
    result = subprocess.run(
        [sys.executable, str(tree / "benchmarks" / bench)],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    return result.stdout + (
        f"\n(exit {result.returncode})\n{result.stderr[-2000:]}" if result.returncode else ""
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base", help="the revision to compare with (e.g. main~3)")
    parser.add_argument("benchmarks", nargs="*", default=DEFAULT)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    base = subprocess.run(
        ["git", "rev-parse", "--short", args.base],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="hvdlite-ab-") as tmp:
        other = Path(tmp) / "base"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(other), base],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        try:
            sides = [(f"base {base}", other), ("this tree", ROOT)]
            for bench in args.benchmarks:
                for round_ in range(args.rounds):
                    order = sides if round_ % 2 == 0 else sides[::-1]
                    for label, tree in order:
                        print(f"=== {bench}, round {round_ + 1}, {label}", flush=True)
                        print(run(tree, bench), flush=True)
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(other)], cwd=ROOT, capture_output=True
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
