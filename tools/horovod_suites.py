"""Run Horovod's own parallel test suites, unchanged, against hvdlite.

``make test-horovod HOROVOD_SRC=<a checkout of github.com/horovod/horovod>`` runs
``test/parallel/test_torch.py`` and ``test_tensorflow.py`` under mpiexec at 2, 3
and 4 ranks, with ``tools/horovod_shim`` first on the path so that
``import horovod.torch as hvd`` gives ``hvdlite.torch``.  Without HOROVOD_SRC
the script clones the repository (where the network allows) into
``.horovod-src/``; the source distribution on the package index has no tests.

Each rank writes its own ``pytest -v`` log, so a run that a hang cut short still
reports the tests that finished.  A test counts as failed when it failed on
any rank.  ``tools/horovod_expected_failures.txt`` lists the failures that are
expected, each with its reason; the script prints passed / failed / skipped
per suite and size, names every unexpected failure and every expected failure
that passed, and exits 1 when there is an unexpected failure.

Not part of ``make test``: the suites take many minutes, and CI has no network.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHIM = ROOT / "tools" / "horovod_shim"
EXPECTED = ROOT / "tools" / "horovod_expected_failures.txt"
CLONE = ROOT / ".horovod-src"
REPOSITORY = "https://github.com/horovod/horovod"
SUITES = {"torch": "test_torch.py", "tensorflow": "test_tensorflow.py"}
_RESULT = re.compile(r"^(\S+\.py::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
_STARTED = re.compile(r"^(\S+\.py::\S+) ")
_COLLECTED = re.compile(r"collected (\d+) items?(?: / (\d+) deselected)?")

# One rank's pytest: its own log file, so that ranks do not interleave.
_RANK_MAIN = """
import os, sys
rank = next((os.environ[k] for k in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
             if k in os.environ), "0")
out = open(os.path.join(sys.argv[1], f"rank{rank}.log"), "w", buffering=1)
os.dup2(out.fileno(), 1)
os.dup2(out.fileno(), 2)
import pytest
sys.exit(pytest.main(sys.argv[2:]))
"""


def horovod_source(given: str) -> Path:
    if given:
        src = Path(given).expanduser().resolve()
    else:
        src = CLONE
        if not (src / "test" / "parallel").is_dir():
            print(f"HOROVOD_SRC is not set: cloning {REPOSITORY} into {src} ...", flush=True)
            result = subprocess.run(["git", "clone", "--depth", "1", REPOSITORY, str(src)])
            if result.returncode:
                sys.exit(
                    "could not clone Horovod; pass HOROVOD_SRC=<a checkout of "
                    f"{REPOSITORY}> (the pip source distribution has no tests)."
                )
    if not (src / "test" / "parallel" / "test_torch.py").is_file():
        sys.exit(
            f"{src} has no test/parallel/test_torch.py: HOROVOD_SRC must be a checkout "
            f"of {REPOSITORY}."
        )
    return src


def expected_failures(path: Path = EXPECTED) -> dict[str, str]:
    """``suite::test`` (or ``suite::test@size``) -> reason, from the expectations file."""
    found = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, reason = line.partition("#")
        found[key.strip()] = reason.strip()
    return found


def results_of(logs: list[Path]) -> dict[str, str]:
    """test id -> outcome over every rank's log (FAILED on any rank wins)."""
    outcome: dict[str, str] = {}
    for log in logs:
        for line in log.read_text(errors="replace").splitlines():
            match = _RESULT.match(line)
            if not match:
                continue
            test, state = match.group(1), match.group(2)
            state = "FAILED" if state == "ERROR" else state
            if outcome.get(test) != "FAILED":
                outcome[test] = state
    return outcome


def ended_early(log: Path, outcome: dict[str, str]) -> str | None:
    """Where a rank's run stopped before every collected test reported (a hang that
    pytest-timeout ended, a crash), or None when every test reported."""
    text = log.read_text(errors="replace") if log.exists() else ""
    match = _COLLECTED.search(text)
    if match is None:
        return "before collecting any test"
    collected = int(match.group(1)) - int(match.group(2) or 0)
    if len(outcome) >= collected:
        return None
    started = [m.group(1) for line in text.splitlines() if (m := _STARTED.match(line))]
    last = started[-1].rsplit("::", 1)[-1] if started else "?"
    return f"{len(outcome)} of {collected} tests reported; it stopped in {last}"


def run_suite(
    src: Path,
    suite: str,
    size: int,
    timeout: float,
    test_timeout: int,
    mpiexec: str,
    select: str | None,
) -> tuple[dict[str, str], bool]:
    """Run one suite at one size; returns (outcomes, why it ended early or None)."""
    workdir = src / "test" / "parallel"
    logs = Path(tempfile.mkdtemp(prefix=f"hvd-{suite}-np{size}-"))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(SHIM), str(ROOT), str(src / "test" / "utils"), str(workdir)]
        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    env.setdefault("HVDLITE_COLLECTIVE_TIMEOUT", str(max(30, test_timeout // 2)))
    # A rank ended by a hang's timeout or a peer's abort loses what its buffers held: the
    # stacks pytest-timeout dumps and the last results would never reach its log.
    env["PYTHONUNBUFFERED"] = "1"
    args = [
        "-v",
        "-p",
        "no:cacheprovider",
        f"--timeout={test_timeout}",
        "--timeout-method=thread",
        "-o",
        "addopts=",
        "--rootdir",
        str(workdir),
        SUITES[suite],
    ]
    if select:
        args += ["-k", select]
    cmd = [mpiexec, "-n", str(size), sys.executable, "-c", _RANK_MAIN, str(logs), *args]
    proc = subprocess.Popen(
        cmd,
        cwd=workdir,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    finished = True
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        finished = False
    print(f"  logs: {logs}")
    outcome = results_of(sorted(logs.glob("rank*.log")))
    early = ended_early(logs / "rank0.log", outcome)
    if not finished:
        early = f"killed after {timeout:.0f} s; " + (early or "every test had reported")
    return outcome, early


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", default=os.environ.get("HOROVOD_SRC", ""))
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 3, 4])
    parser.add_argument("--suites", nargs="+", default=list(SUITES), choices=list(SUITES))
    parser.add_argument(
        "--timeout",
        type=float,
        default=1800.0,
        help="seconds for one suite at one size (the job is killed after)",
    )
    parser.add_argument("--test-timeout", type=int, default=120, help="seconds per test")
    parser.add_argument("-k", dest="select", help="pytest -k expression (a subset)")
    args = parser.parse_args(argv)
    src = horovod_source(args.src)
    mpiexec = str(Path(sys.executable).with_name("mpiexec"))
    if not Path(mpiexec).exists():
        mpiexec = "mpiexec"
    expected = expected_failures()
    unexpected_total = 0
    summary = []
    for suite in args.suites:
        for size in args.sizes:
            print(f"== {SUITES[suite]} at {size} ranks", flush=True)
            outcome, early = run_suite(
                src, suite, size, args.timeout, args.test_timeout, mpiexec, args.select
            )
            counts = {
                s: sum(1 for v in outcome.values() if v == s)
                for s in ("PASSED", "FAILED", "SKIPPED")
            }
            failed = sorted(t for t, v in outcome.items() if v == "FAILED")
            unexpected, known = [], []
            for test in failed:
                name = test.rsplit("::", 1)[-1]
                reason = expected.get(f"{suite}::{name}@{size}") or expected.get(f"{suite}::{name}")
                (known if reason else unexpected).append((name, reason))
            fixed = sorted(
                name
                for key in expected
                for name in [key.split("::", 1)[1].split("@")[0]]
                if key.startswith(f"{suite}::")
                and (key.endswith(f"@{size}") or "@" not in key)
                and any(t.endswith("::" + name) and v == "PASSED" for t, v in outcome.items())
            )
            line = (
                f"{SUITES[suite]} np={size}: {counts['PASSED']} passed, "
                f"{counts['FAILED']} failed ({len(known)} expected), "
                f"{counts['SKIPPED']} skipped"
                + ("" if early is None else f"; ENDED EARLY: {early}")
            )
            summary.append(line)
            print(line)
            for name, reason in known:
                print(f"   expected: {name}  ({reason})")
            for name, _ in unexpected:
                print(f"   UNEXPECTED FAILURE: {name}")
            for name in fixed:
                print(f"   expected to fail but passed: {name}")
            unexpected_total += len(unexpected) + (0 if early is None else 1)
    print("\n".join(["", "Horovod's suites through hvdlite:", *summary]))
    return 1 if unexpected_total else 0


if __name__ == "__main__":
    sys.exit(main())
