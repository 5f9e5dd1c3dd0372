"""The soak (tools/soak.py): a short real run at 2 ranks, and its judge on made-up samples.

``make soak`` runs 30 minutes at 4 ranks; here the job trains for 30 seconds, sampled
every 5, which is enough to see every path of the tool work (the table, the judge,
the checks after the job) though not to find a slow leak.
"""

from __future__ import annotations

import subprocess
import sys
from multiprocessing import shared_memory
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import soak  # noqa: E402
from soak import ProcSample, Sample, Tolerance, judge  # noqa: E402

MB = 1024  # kB


def _samples(n=10, rss_mb=(400, 400), fds=30, threads=5, shm=("a", "b"), every=60.0):
    """*n* samples of two ranks and hvdrun; each field a value, or a function of the
    sample's index giving it."""

    def at(value, i):
        return value(i) if callable(value) else value

    samples = []
    for i in range(n):
        procs = {
            f"rank {r}": ProcSample(
                int(at(rss_mb[r], i) * MB), at(fds, i), at(threads, i), frozenset(at(shm, i))
            )
            for r in range(2)
        }
        procs["hvdrun"] = ProcSample(30 * MB, 8, 3)
        samples.append(Sample(i * every, procs))
    return samples


def _by_name(verdicts):
    return {v.name: v for v in verdicts}


def test_flat_samples_pass_every_resource():
    verdicts = judge(_samples())
    assert all(v.ok for v in verdicts), [v.line() for v in verdicts]
    names = set(_by_name(verdicts))
    assert {"rss", "fds", "threads", "shm segments", "launcher rss", "launcher fds"} <= names


def test_rss_that_grows_steadily_fails_naming_the_rank_and_the_growth():
    # rank 1 keeps 4 MB a minute: 408 -> 436 MB from minute 2 to 9, over 5% + 4 MB.
    verdicts = _by_name(judge(_samples(rss_mb=(400, lambda i: 400 + 4 * i))))
    assert not verdicts["rss"].ok
    assert "rank 1" in verdicts["rss"].detail and "+28.0 MB" in verdicts["rss"].detail
    assert verdicts["fds"].ok and verdicts["threads"].ok


def test_rss_noise_within_the_tolerance_passes():
    verdicts = _by_name(judge(_samples(rss_mb=(lambda i: 400 + (i % 3), 400))))
    assert verdicts["rss"].ok, verdicts["rss"].line()


def test_growth_during_the_warm_up_is_not_counted():
    # 100 MB more by the second sample (pages touched, caches filled), flat after.
    verdicts = _by_name(judge(_samples(rss_mb=(lambda i: 300 if i < 2 else 400, 400))))
    assert verdicts["rss"].ok, verdicts["rss"].line()


def test_one_more_descriptor_thread_or_segment_fails():
    fds = _by_name(judge(_samples(fds=lambda i: 30 + (i == 7))))["fds"]
    assert not fds.ok and "30 at 2:00 -> 31 at 7:00" in fds.detail
    assert not _by_name(judge(_samples(threads=lambda i: 5 + i // 5)))["threads"].ok
    shm = _by_name(judge(_samples(shm=lambda i: ["a", "b"] + (["c"] if i > 5 else []))))
    assert not shm["shm segments"].ok


def test_too_few_samples_after_the_warm_up_fail():
    (verdict,) = judge(_samples(n=3))
    assert verdict.name == "samples" and not verdict.ok


def test_a_rank_missing_from_a_sample_fails():
    samples = _samples()
    del samples[-1].procs["rank 1"]
    (verdict,) = judge(samples)
    assert not verdict.ok and "rank 1 missing at 9:00" in verdict.detail


def test_the_warm_up_is_two_samples_or_a_fifth_of_them():
    tol = Tolerance()
    assert [soak.warmup_count(n, tol) for n in (3, 6, 10, 11, 31)] == [2, 2, 2, 3, 7]


def test_a_row_shows_the_ranks_extremes_and_the_jobs_segments():
    row = soak.format_row(_samples(rss_mb=(401.25, 399.5), shm=lambda i: ["x"])[3])
    assert row.split() == ["3:00", "2", "401.2/399.5", "30/30", "5/5", "1"]


def test_segments_are_read_from_the_mappings_named_or_unlinked():
    seg = shared_memory.SharedMemory(create=True, size=4096)
    try:
        seg.buf[0] = 1  # mapped by this process
        names, named = soak.shm_segments(soak.os.getpid())
        assert seg.name.lstrip("/") in names and seg.name.lstrip("/") in named
        seg.unlink()
        names, named = soak.shm_segments(soak.os.getpid())
        assert seg.name.lstrip("/") in names and seg.name.lstrip("/") not in named
    finally:
        seg.close()


def test_a_descriptor_open_for_a_moment_is_not_counted(monkeypatch):
    # The wrapper holds a /proc file open for a moment every half second; a read
    # that lands then sees one more descriptor.  What leaks is there at every read.
    reads = iter([17, 16, 17, 18, 18, 18])
    monkeypatch.setattr(soak.os, "listdir", lambda path: [None] * next(reads))
    monkeypatch.setattr(soak, "STEADY_GAP", 0.0)
    assert soak.steady_count("/proc/1/fd") == 16
    assert soak.steady_count("/proc/1/fd") == 18


def test_a_named_segment_left_behind_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(soak, "SHM_DIR", f"{tmp_path}/")
    (tmp_path / "mpich_shm_left").write_bytes(b"")
    procs, shm = soak.leftover_verdicts("no-such-marker", {"mpich_shm_left", "gone"}, 0)
    assert procs.ok
    assert not shm.ok and "mpich_shm_left" in shm.detail and "gone" not in shm.detail


@pytest.mark.timeout(150)
def test_a_short_soak_at_two_ranks_passes_and_prints_its_table():
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "soak.py"), "--np", "2"]
        + ["--minutes", "0.5", "--interval", "5"],
        capture_output=True,
        text=True,
        timeout=140,
        cwd=ROOT,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    assert soak.HEADER in out, out
    rows = out.split(soak.HEADER, 1)[1].split("\n\n", 1)[0].strip().splitlines()
    assert len(rows) >= 5, out
    assert all(row.split()[1] == "2" for row in rows), out
    for name in ("rss", "fds", "threads", "shm segments", "processes left", "shm left"):
        assert f"PASS  {name}:" in out, out
    assert "soak: PASS" in out, out
