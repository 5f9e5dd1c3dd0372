"""Run Horovod's own parallel test suites, unchanged, against hvdlite.

``make test-horovod HOROVOD_SRC=<a checkout of github.com/horovod/horovod>`` runs
``test/parallel/test_torch.py``, ``test_tensorflow.py`` and the smaller suites in
:data:`SUITES` (process sets, the timeline) under mpiexec at 2, 3 and 4 ranks,
with ``hvdlite/horovod_compat`` first on the path so that ``import horovod.torch as
hvd`` gives ``hvdlite.torch`` (the ``horovod`` package ``hvdrun --as-horovod`` gives
every rank).  Without HOROVOD_SRC
the script clones the repository (where the network allows) into
``.horovod-src/``; the source distribution on the package index has no tests.

Each rank writes its own ``pytest -v`` log, so a run that a hang cut short still
reports the tests that finished.  A test counts as failed when it, or one of its
subtests, failed on any rank.  A run that a hang ends (pytest-timeout, or
hvdlite's collective timeout) is resumed without the tests that reported and the
one it stopped in, which counts as failed: one hang costs one test.
``tools/horovod_expected_failures.txt`` lists the failures that are expected,
each with its reason, and marks the few that are not run at all because they
fail on some ranks only, which parts the ranks for the rest of the suite.  The
script prints passed / failed / skipped per suite and size, names every
unexpected failure and every expected failure that passed, and exits 1 when
there is an unexpected failure or a test that never reported.

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
# The directory holding hvdlite's `horovod` package (hvdlite.horovod_compat.PATH).
SHIM = ROOT / "hvdlite" / "horovod_compat"
EXPECTED = ROOT / "tools" / "horovod_expected_failures.txt"
CLONE = ROOT / ".horovod-src"
REPOSITORY = "https://github.com/horovod/horovod"
SUITES = {
    "torch": "test_torch.py",
    "tensorflow": "test_tensorflow.py",
    "tensorflow_process_sets": "test_tensorflow_process_sets.py",
    "tensorflow_process_sets_dynamic": "test_tensorflow_process_sets_dynamic.py",
    "process_sets_static": "test_process_sets_static.py",
    "process_sets_multi_comm": "test_process_sets_multi_comm.py",
    "timeline": "test_timeline.py",
}
_RESULT = re.compile(r"^(\S+\.py::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
_STARTED = re.compile(r"^(\S+\.py::\S+) ")
_COLLECTED = re.compile(r"collected (\d+) items?(?: / (\d+) deselected)?")

# One rank's pytest: its own log file, so that ranks do not interleave.  A small plugin
# leaves out the tests named in HOROVOD_SUITES_DESELECT (``Class::test`` or a bare test
# name, exactly), and writes a
# FAILED line for a test of which any part failed: pytest reports a test PASSED when
# only its subtests failed (TensorFlow's run_in_graph_and_eager_modes runs each half
# as a subtest), and names those failures only in its closing summary, which a run
# that a hang ends never prints.
_RANK_MAIN = """
import os, sys
rank = next((os.environ[k] for k in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
             if k in os.environ), "0")
out = open(os.path.join(sys.argv[1], f"rank{rank}.log"), "w", buffering=1)
os.dup2(out.fileno(), 1)
os.dup2(out.fileno(), 2)
import pytest

class Plugin:
    def __init__(self):
        self.names = set(filter(None, os.environ.get("HOROVOD_SUITES_DESELECT", "").split(",")))
        self.failed = set()

    def left_out(self, item):
        return item.name in self.names or item.nodeid.split("::", 1)[-1] in self.names

    def pytest_collection_modifyitems(self, config, items):
        dropped = [item for item in items if self.left_out(item)]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = [item for item in items if not self.left_out(item)]

    def pytest_runtest_logreport(self, report):
        if report.failed:
            self.failed.add(report.nodeid)

    def pytest_runtest_logfinish(self, nodeid, location):
        if nodeid in self.failed:
            out.write(f"\\n{nodeid} FAILED (a part of it failed on this rank)\\n")

sys.exit(pytest.main(sys.argv[2:], plugins=[Plugin()]))
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


def _entries(path: Path):
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, reason = line.partition("#")
        key = key.strip()
        deselect = key.startswith(_DESELECT)
        yield key.removeprefix(_DESELECT).strip(), reason.strip(), deselect


_DESELECT = "deselect "


def expected_failures(path: Path = EXPECTED) -> dict[str, str]:
    """``suite::test`` (or ``suite::test@size``) -> reason, from the expectations file
    (the deselected ones included: they are expected failures that are not run)."""
    return {key: reason for key, reason, _ in _entries(path)}


def deselected(path: Path = EXPECTED) -> dict[str, str]:
    """The expected failures not to run at all (a line starting with ``deselect``):
    they fail on a subset of the ranks, which then leave the test while the others
    are still in its collectives, so every later test would hang."""
    return {key: reason for key, reason, deselect in _entries(path) if deselect}


def _applies(key: str, suite: str, size: int) -> str | None:
    """The test name of an expectations key if it applies to this suite and size."""
    head, _, at = key.partition("@")
    if not head.startswith(f"{suite}::") or (at and int(at) != size):
        return None
    return head.split("::", 1)[1]


def _key(nodeid: str) -> str:
    """``Class::test`` of a node id (a bare test name may be in two classes)."""
    return nodeid.split("::", 1)[-1]


def _name(key: str) -> str:
    return key.rsplit("::", 1)[-1]


def rank_results(log: Path) -> dict[str, str]:
    """``Class::test`` -> outcome in one rank's log (FAILED wins over a PASSED line: a test
    whose subtest failed reports PASSED, then the plugin's FAILED line)."""
    outcome: dict[str, str] = {}
    text = log.read_text(errors="replace") if log.exists() else ""
    for line in text.splitlines():
        match = _RESULT.match(line)
        if not match:
            continue
        test, state = _key(match.group(1)), match.group(2)
        state = "FAILED" if state == "ERROR" else state
        if outcome.get(test) != "FAILED":
            outcome[test] = state
    return outcome


def _started(log: Path) -> list[str]:
    text = log.read_text(errors="replace") if log.exists() else ""
    names = [_key(m.group(1)) for line in text.splitlines() if (m := _STARTED.match(line))]
    return list(dict.fromkeys(names))


def _collected(log: Path) -> int | None:
    text = log.read_text(errors="replace") if log.exists() else ""
    match = _COLLECTED.search(text)
    return None if match is None else int(match.group(1)) - int(match.group(2) or 0)


class Attempt:
    """One mpiexec run of a suite: what each rank reported, and where each stopped."""

    def __init__(self, logs: list[Path], finished: bool):
        self.logs = logs
        self.finished = finished
        self.per_rank = [rank_results(log) for log in logs]
        self.collected = _collected(logs[0]) if logs else None
        self.started = [_started(log) for log in logs]

    def settled(self) -> dict[str, str]:
        """Tests with a final outcome: failed on some rank, or reported by every rank."""
        names = set().union(*self.per_rank) if self.per_rank else set()
        out = {}
        for name in names:
            states = [r.get(name) for r in self.per_rank]
            if "FAILED" in states:
                out[name] = "FAILED"
            elif None not in states:
                out[name] = "SKIPPED" if "SKIPPED" in states else states[0]
        return out

    def culprit(self) -> str | None:
        """The test the run stopped in: where a rank stopped (started, unreported on
        that rank), the first such in the order the tests ran."""
        stops = [
            started[-1]
            for started, results in zip(self.started, self.per_rank)
            if started and started[-1] not in results
        ]
        if not stops:
            return None
        order = {name: i for started in self.started for i, name in enumerate(started)}
        return min(stops, key=lambda name: order.get(name, 0))


def run_once(
    src: Path,
    suite: str,
    size: int,
    timeout: float,
    test_timeout: int,
    mpiexec: str,
    select: str | None,
    leave_out: set[str],
) -> Attempt:
    """One mpiexec run of a suite at a size, without the tests named in leave_out."""
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
    env["HOROVOD_SUITES_DESELECT"] = ",".join(sorted(leave_out))
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
    print(f"  logs: {logs}", flush=True)
    return Attempt([logs / f"rank{r}.log" for r in range(size)], finished)


def run_suite(
    src: Path,
    suite: str,
    size: int,
    timeout: float,
    test_timeout: int,
    mpiexec: str,
    select: str | None,
    skip: set[str] = frozenset(),
    resumes: int = 5,
) -> tuple[dict[str, str], list[str]]:
    """Run one suite at one size; returns (test name -> outcome, notes on each run that
    ended early).  A run that a hang (or a crash) ends early is resumed without the
    tests that reported and the one it stopped in, which counts as failed, so one
    hang costs one test, not the rest of the suite."""
    outcome: dict[str, str] = {}
    notes: list[str] = []
    for _ in range(resumes + 1):
        attempt = run_once(
            src, suite, size, timeout, test_timeout, mpiexec, select, skip | set(outcome)
        )
        settled = attempt.settled()
        outcome.update(settled)
        if attempt.collected is None:
            notes.append("a run ended before collecting any test: the tests never reported")
            break
        if attempt.finished and len(settled) >= attempt.collected:
            break
        culprit = attempt.culprit()
        where = "killed at the suite's time limit" if not attempt.finished else "ended early"
        notes.append(f"a run {where} in {culprit or '?'}")
        if culprit is None:
            notes.append(f"{attempt.collected - len(settled)} tests never reported")
            break
        outcome[culprit] = "FAILED"
        if len(set(settled) | {culprit}) >= attempt.collected:
            break
    else:
        notes.append(f"no resume left: {attempt.collected - len(settled)} tests never reported")
    return outcome, notes


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", default=os.environ.get("HOROVOD_SRC", ""))
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 3, 4])
    parser.add_argument("--suites", nargs="+", default=list(SUITES), choices=list(SUITES))
    parser.add_argument(
        "--timeout",
        type=float,
        default=1800.0,
        help="seconds for one run of a suite at one size (the job is killed after)",
    )
    # At 4 ranks on 2 cores test_horovod_broadcast_inplace_cpu takes about 4 minutes: each
    # of its 192 TF1-graph cases fetches an in-place broadcast, and fetching a collective in
    # a TF1 graph also runs every collective created before it in that graph.
    parser.add_argument("--test-timeout", type=int, default=360, help="seconds per test")
    parser.add_argument("-k", dest="select", help="pytest -k expression (a subset)")
    parser.add_argument(
        "--resumes",
        type=int,
        default=5,
        help="times a run that a hang ended is resumed after the test it stopped in",
    )
    args = parser.parse_args(argv)
    src = horovod_source(args.src)
    mpiexec = str(Path(sys.executable).with_name("mpiexec"))
    if not Path(mpiexec).exists():
        mpiexec = "mpiexec"
    expected = expected_failures()
    not_run = deselected()
    unexpected_total = 0
    summary = []
    for suite in args.suites:
        for size in args.sizes:
            print(f"== {SUITES[suite]} at {size} ranks", flush=True)
            skip = {name for key in not_run if (name := _applies(key, suite, size))}
            outcome, notes = run_suite(
                src,
                suite,
                size,
                args.timeout,
                args.test_timeout,
                mpiexec,
                args.select,
                skip,
                args.resumes,
            )
            counts = {
                s: sum(1 for v in outcome.values() if v == s)
                for s in ("PASSED", "FAILED", "SKIPPED")
            }
            unexpected, known = [], []
            for test in sorted(t for t, v in outcome.items() if v == "FAILED"):
                name = _name(test)
                reason = expected.get(f"{suite}::{name}@{size}") or expected.get(f"{suite}::{name}")
                (known if reason else unexpected).append((name, reason))
            passed = {_name(t) for t, v in outcome.items() if v == "PASSED"}
            fixed = sorted(
                name for key in expected if (name := _applies(key, suite, size)) in passed
            )
            line = (
                f"{SUITES[suite]} np={size}: {counts['PASSED']} passed, "
                f"{counts['FAILED']} failed ({len(known)} expected), "
                f"{counts['SKIPPED']} skipped"
                + (f", {len(skip)} not run (expected to fail and part the ranks)" if skip else "")
                + ("" if not notes else f"; {'; '.join(notes)}")
            )
            summary.append(line)
            print(line)
            for name, reason in known:
                print(f"   expected: {name}  ({reason})")
            for name in sorted(skip):
                reason = expected.get(f"{suite}::{name}@{size}") or expected.get(f"{suite}::{name}")
                print(f"   not run: {name}  ({reason})")
            for name, _ in unexpected:
                print(f"   UNEXPECTED FAILURE: {name}")
            for name in fixed:
                print(f"   expected to fail but passed: {name}")
            unexpected_total += len(unexpected) + sum("never" in note for note in notes)
    print("\n".join(["", "Horovod's suites through hvdlite:", *summary]))
    return 1 if unexpected_total else 0


if __name__ == "__main__":
    sys.exit(main())
