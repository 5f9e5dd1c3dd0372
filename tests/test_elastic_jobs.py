"""Elastic jobs for real: hvdrun relaunching real ranks after real failures and host changes.

Each test runs hvdrun on a script in tests/elastic_scripts/ with a hard time
limit; the process group is killed on a timeout, and every test checks that no
rank outlived the job.  The discovery interval is 0.2 s
(``HVDLITE_ELASTIC_DISCOVERY_INTERVAL``) so host changes are seen at once.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path

import pytest
from helpers_runner.common import Result, clean_env, gone_within, hvdrun_cmd, run

SCRIPTS = Path(__file__).resolve().parent / "elastic_scripts"
PY = sys.executable


@pytest.fixture
def job_env():
    """The jobs' environment, marked so that leftover processes can be found."""
    marker = f"HVDLITE_ELASTIC_TEST_MARKER={uuid.uuid4().hex}"
    name, value = marker.split("=")
    env = clean_env(
        HVDLITE_ELASTIC_DISCOVERY_INTERVAL="0.2", TF_CPP_MIN_LOG_LEVEL="3", **{name: value}
    )
    yield env
    assert gone_within(marker, 15), "ranks outlived the job"


def _hvdrun(tmp_path, env, *args, timeout=150.0) -> Result:
    return run(
        hvdrun_cmd("--elastic-state-dir", str(tmp_path / "state"), *args), timeout=timeout, env=env
    )


def _discovery(tmp_path, hosts: str) -> tuple[Path, Path]:
    hostsfile, script = tmp_path / "hosts.txt", tmp_path / "discover.sh"
    hostsfile.write_text(hosts + "\n")
    script.write_text(f"#!/bin/sh\ncat {hostsfile}\n")
    script.chmod(0o755)
    return hostsfile, script


def _two_ranks_uninterrupted(tmp_path, env):
    """A 2-rank torch_train.py run without faults (its final weights in plain/final.pt):
    ``(plain, elastic, script, train)``, the elastic run's output folder made too."""
    plain, elastic = tmp_path / "plain", tmp_path / "elastic"
    plain.mkdir()
    elastic.mkdir()
    script = str(SCRIPTS / "torch_train.py")
    train = ("--epochs", "2", "--batches", "4", "--commit-every", "2")
    uninterrupted = run(
        hvdrun_cmd("-np", "2", PY, script, *train, "--out", str(plain)), timeout=90, env=env
    )
    assert uninterrupted.returncode == 0, uninterrupted.output
    return plain, elastic, script, train


@pytest.mark.timeout(300)
def test_torch_rank_killed_mid_epoch_resumes_from_the_last_commit(tmp_path, job_env):
    out, replay = tmp_path / "elastic", tmp_path / "replay"
    out.mkdir()
    replay.mkdir()
    script = str(SCRIPTS / "torch_train.py")
    result = _hvdrun(
        tmp_path,
        job_env,
        "-np",
        "3",
        "--max-restarts",
        "1",
        PY,
        script,
        "--epochs",
        "2",
        "--batches",
        "6",
        "--commit-every",
        "2",
        "--kill-rank",
        "1",
        "--kill-at",
        "9",
        "--out",
        str(out),
    )
    log = result.output
    assert result.returncode == 0, log
    assert (
        "rank 1 on host" in log
        and "killed by signal 9 (SIGKILL): relaunching (restart 1 of 1)" in log
    ), log
    assert "launch 1: 3 rank(s) on localhost:3, resuming from commit 5 (epoch=1, batch=2)" in log, (
        log
    )
    assert "hvdlite.elastic: resuming from commit 5 (epoch=1, batch=2) with 3 rank(s)" in log
    assert not (tmp_path / "state").exists() or not any((tmp_path / "state").iterdir())
    # An uninterrupted 3-rank run from the commit the elastic job resumed from.
    again = run(
        hvdrun_cmd(
            "-np",
            "3",
            PY,
            script,
            "--epochs",
            "2",
            "--batches",
            "6",
            "--commit-every",
            "2",
            "--out",
            str(replay),
            "--start-from",
            str(out / "resumed.pt"),
            "--compare-with",
            str(out / "final.pt"),
        ),
        timeout=120,
        env=job_env,
    )
    assert again.returncode == 0, again.output
    assert (
        "replaying from epoch 1 batch 2 with 3 ranks (the commit was resumed with 3)"
        in again.stdout
    ), again.output
    assert f"weights equal those of {out / 'final.pt'}: True" in again.stdout, again.output


@pytest.mark.timeout(300)
def test_a_sharded_optimizer_resumes_on_fewer_ranks_resharded(tmp_path, job_env):
    # 3 ranks shard SGD's momentum; rank 2 dies after shrinking the discovered hosts to
    # 2 slots, so the job resumes from its last commit on 2 ranks: the committed
    # (consolidated) state is resharded over 2.  A 2-rank run from what it resumed
    # with, uninterrupted, must end with the same weights.
    hostsfile, discover = _discovery(tmp_path, "localhost:3")
    out, replay = tmp_path / "elastic", tmp_path / "replay"
    out.mkdir()
    replay.mkdir()
    script = str(SCRIPTS / "torch_train.py")
    common = ["--epochs", "2", "--batches", "6", "--commit-every", "2", "--sharded"]
    result = _hvdrun(
        tmp_path,
        job_env,
        "--min-np",
        "2",
        "--max-np",
        "3",
        "--max-restarts",
        "2",
        "--host-discovery-script",
        str(discover),
        PY,
        script,
        *common,
        "--kill-rank",
        "2",
        "--kill-at",
        "9",
        "--hosts-file",
        str(hostsfile),
        "--shrink-to",
        "localhost:2",
        "--out",
        str(out),
    )
    log = result.output
    assert result.returncode == 0, log
    assert "launch 1: 2 rank(s) on localhost:2, resuming from commit" in log, log
    assert "finished 2 epochs with 2 ranks" in log, log
    again = run(
        hvdrun_cmd(
            "-np",
            "2",
            PY,
            script,
            *common,
            "--out",
            str(replay),
            "--start-from",
            str(out / "resumed.pt"),
            "--compare-with",
            str(out / "final.pt"),
        ),
        timeout=120,
        env=job_env,
    )
    assert again.returncode == 0, again.output
    assert "(the commit was resumed with 2)" in again.stdout, again.output
    assert f"weights equal those of {out / 'final.pt'}: True" in again.stdout, again.output


def _edit_hosts_when_paused(signal_dir: Path, hostsfile: Path, steps: dict, stop):
    """Launch N pauses (pause.N appears) -> write steps[N] into the discovery file."""
    pending = dict(steps)
    while pending and not stop.is_set():
        for launch in list(pending):
            if (signal_dir / f"pause.{launch}").exists():
                hostsfile.write_text(pending.pop(launch) + "\n")
        time.sleep(0.05)


@pytest.mark.timeout(300)
def test_hosts_from_discovery_2_3_2_with_elastic_sampler(tmp_path, job_env):
    hostsfile, discover = _discovery(tmp_path, "localhost:2")
    signal_dir, log = tmp_path / "signals", tmp_path / "steps.jsonl"
    signal_dir.mkdir()
    stop = threading.Event()
    editor = threading.Thread(
        target=_edit_hosts_when_paused,
        daemon=True,
        args=(signal_dir, hostsfile, {0: "localhost:3", 1: "localhost:2"}, stop),
    )
    editor.start()
    try:
        result = _hvdrun(
            tmp_path,
            job_env,
            "--min-np",
            "2",
            "--max-np",
            "3",
            "--host-discovery-script",
            str(discover),
            PY,
            str(SCRIPTS / "sampler_resize.py"),
            "--samples",
            "36",
            "--batch",
            "2",
            "--epochs",
            "3",
            "--pause",
            "3",
            "--log",
            str(log),
            "--signal-dir",
            str(signal_dir),
        )
    finally:
        stop.set()
        editor.join(timeout=5)
    assert result.returncode == 0, result.output
    assert "hosts changed: localhost:2 -> localhost:3" in result.stderr, result.output
    assert "hosts changed: localhost:3 -> localhost:2" in result.stderr, result.output
    assert "launch 2: 2 rank(s) on localhost:2, resuming from commit" in result.stderr
    records = [json.loads(line) for line in log.read_text().splitlines()]
    starts = [r for r in records if "reset_sizes" in r]
    # hvd.size() inside each launch, and what the reset callback saw after each relaunch
    assert [(r["launch"], r["size"], r["reset_sizes"]) for r in starts] == [
        (0, 2, []),
        (1, 3, [3]),
        (2, 2, [2]),
    ], records
    per_epoch = defaultdict(list)
    sizes = defaultdict(set)
    for record in records:
        if "indices" in record:
            per_epoch[record["epoch"]].extend(record["indices"])
            sizes[record["epoch"]].add(record["size"])
    assert sorted(per_epoch) == [0, 1, 2]
    for epoch, indices in per_epoch.items():
        assert sorted(indices) == list(range(36)), (epoch, indices)  # each sample once
    assert sizes == {0: {2, 3}, 1: {3, 2}, 2: {2}}  # epochs 0 and 1 changed size midway


@pytest.mark.timeout(300)
def test_keras_fit_with_elastic_callbacks_survives_a_killed_rank(tmp_path, job_env):
    result = _hvdrun(
        tmp_path,
        job_env,
        "-np",
        "2",
        "--max-restarts",
        "1",
        PY,
        str(SCRIPTS / "keras_fit.py"),
        "--epochs",
        "3",
        "--steps",
        "6",
        "--kill-rank",
        "1",
        "--kill-at",
        "8",
    )
    assert result.returncode == 0, result.output
    assert "killed by signal 9 (SIGKILL): relaunching (restart 1 of 1)" in result.stderr
    # batches_per_commit=2: the commit after batch index 1 of the second epoch
    assert "resuming from commit 5 (epoch=1, batch=1)" in result.stderr, result.output
    assert "fit done: state.epoch=3" in result.stdout, result.output


def _objects(
    tmp_path, env, *args, hvdrun_args=("-np", "2", "--max-restarts", "2"), timeout=120.0
) -> Result:
    return _hvdrun(
        tmp_path,
        env,
        *hvdrun_args,
        PY,
        str(SCRIPTS / "objects_train.py"),
        "--steps",
        "12",
        "--commit-every",
        "2",
        *args,
        timeout=timeout,
    )


@pytest.mark.timeout(150)
def test_a_crash_inside_commit_resumes_from_the_previous_commit(tmp_path, job_env):
    result = _objects(tmp_path, job_env, "--crash-in-commit", "3")
    assert result.returncode == 0, result.output
    assert "dying inside commit 3" in result.stdout, result.output
    assert "resuming from commit 2 (step=4, total=10.0)" in result.stderr, result.output
    assert "final total=78 steps=12" in result.stdout, result.output  # no step lost or doubled


@pytest.mark.timeout(150)
def test_rank_0_killed_as_commit_returns_resumes_from_that_commit(tmp_path, job_env):
    # The default commit is on disk before commit() returns on any rank: rank 0 dying
    # the moment it returns loses nothing that commit() reported done.
    result = _objects(tmp_path, job_env, "--kill-after-commit", "3")
    assert result.returncode == 0, result.output
    assert "rank 0 dies as commit 3 returns" in result.stdout, result.output
    assert "resuming from commit 3 (step=6, total=21.0)" in result.stderr, result.output
    assert "final total=78 steps=12" in result.stdout, result.output


@pytest.mark.timeout(150)
def test_a_corrupt_commit_resumes_from_its_verified_spare_saying_so(tmp_path, job_env):
    result = _objects(tmp_path, job_env, "--corrupt-after", "2")
    assert result.returncode == 0, result.output
    assert "is corrupt (the checksum of its state does not match)" in result.stderr
    assert (
        "Resuming instead from the commit before it, commit 1 (step=2, total=3.0), in "
        in result.stderr
        and "state.hvdlite.spare, whose checksum matches" in result.stderr
    )
    assert "final total=78 steps=12" in result.stdout, result.output  # nothing lost twice


@pytest.mark.timeout(150)
def test_a_corrupt_commit_and_spare_are_an_error_not_a_fresh_start(tmp_path, job_env):
    result = _objects(tmp_path, job_env, "--corrupt-after", "2", "--corrupt-spare-too")
    assert result.returncode == 1, result.output
    assert (
        "is corrupt (the checksum of its state does not match): the job cannot resume "
        "from it" in result.stderr
    ), result.output
    assert "state.hvdlite.spare cannot be used either" in result.stderr, result.output
    assert "launch 2:" not in result.stderr and "final total" not in result.stdout


@pytest.mark.timeout(150)
def test_elastic_resume_continues_a_job_whose_hvdrun_ended(tmp_path, job_env):
    # hvdrun ends (here: its restart budget is spent; in life a reboot or a batch time
    # limit) and its last commit stays; a new hvdrun resumes that job by its id.
    first = _objects(
        tmp_path,
        job_env,
        "--kill-rank",
        "0",
        "--kill-at",
        "5",
        hvdrun_args=("-np", "2", "--max-restarts", "0"),
    )
    assert first.returncode == 128 + signal.SIGKILL, first.output
    job_id = first.stderr.split("resume with --elastic-resume ", 1)[1].split(")")[0]
    again = _objects(
        tmp_path,
        job_env,
        hvdrun_args=("-np", "2", "--max-restarts", "1", "--elastic-resume", job_id),
    )
    assert again.returncode == 0, again.output
    assert (
        "launch 1: 2 rank(s) on localhost:2, resuming from commit 2 (step=4, total=10.0)"
        in again.stderr
    ), again.output
    assert "final total=78 steps=12" in again.stdout, again.output
    # An hvdrun that ended before the job's first commit left only the job's directory:
    # resuming it starts over, saying so.
    from hvdlite.elastic import layout

    fresh = tmp_path / "state" / "job-without-commit"
    fresh.mkdir(mode=0o700)
    layout.write_marker(str(fresh), fresh.name)
    over = _objects(
        tmp_path,
        job_env,
        hvdrun_args=("-np", "2", "--max-restarts", "1", "--elastic-resume", fresh.name),
    )
    assert over.returncode == 0, over.output
    assert (
        "job job-without-commit has no commit yet (hvdrun ended before the first): "
        "starting over" in over.stderr
    ), over.output
    assert "final total=78 steps=12" in over.stdout, over.output
    missing = _objects(
        tmp_path,
        job_env,
        hvdrun_args=("-np", "2", "--max-restarts", "1", "--elastic-resume", "no-such-job"),
    )
    assert (
        missing.returncode == 2
        and "--elastic-resume no-such-job: no commit of that job" in missing.stderr
    ), missing.output


@pytest.mark.timeout(150)
def test_a_host_that_keeps_failing_is_left_out_naming_it(tmp_path, job_env):
    # The first failure is a process failure (relaunch there); the second one soon after
    # on the same host is evidence about the host: it is left out, and with fewer than
    # --min-np slots the job ends naming it.
    _hostsfile, discover = _discovery(tmp_path, "localhost:2")
    started = time.monotonic()
    result = _objects(
        tmp_path,
        job_env,
        "--kill-rank",
        "1",
        "--kill-at",
        "3",
        "--every-launch",
        hvdrun_args=(
            "--min-np",
            "2",
            "--host-discovery-script",
            str(discover),
            "--elastic-timeout",
            "1",
        ),
    )
    assert result.returncode == 1, result.output
    assert "a process failure, not the host's (host localhost is reachable" in result.stderr
    assert result.stderr.count("launch 1:") == 1 and "launch 2:" not in result.stderr
    assert (
        "error: only 0 slot(s) available (no host), fewer than --min-np 2, after waiting "
        "1 s (--elastic-timeout); lost: localhost (rank 1 failed there (killed by signal 9 "
        "(SIGKILL)) and its ranks failed again " in result.stderr
    ), result.output
    assert (
        "s after the previous failure there; left out for the rest of the job)" in result.stderr
    ), result.output
    assert "the last commit stays in" in result.stderr
    assert time.monotonic() - started < 60


@pytest.mark.timeout(150)
def test_a_host_ssh_cannot_reach_is_left_out_and_the_others_go_on(tmp_path, job_env):
    # As when a host's link is cut mid-job (tools/chaos.py --hosts): before a launch
    # hvdrun's ssh check cannot log in to a host the discovery script lists.  The host is
    # left out, naming ssh's reason, and the launch placed again on the others.
    if __import__("shutil").which("ssh") is None:
        pytest.skip("no ssh client")
    _hostsfile, discover = _discovery(tmp_path, "localhost:2\nno-such-host.invalid:1")
    result = _objects(
        tmp_path,
        job_env,
        hvdrun_args=("--min-np", "2", "--max-np", "3", "--host-discovery-script", str(discover)),
    )
    assert result.returncode == 0, result.output
    assert "launch 0: 3 rank(s) on localhost:2,no-such-host.invalid:1, from the start" in (
        result.stderr
    ), result.output
    assert (
        "host no-such-host.invalid is left out: ssh cannot log in to it (ssh: Could not "
        "resolve hostname no-such-host.invalid" in result.stderr
    ), result.output
    assert "launch 0: 2 rank(s) on localhost:2, from the start" in result.stderr, result.output
    assert "final total=78 steps=12 size=2" in result.stdout, result.output


@pytest.mark.timeout(150)
def test_too_few_hosts_ssh_can_reach_end_the_job_naming_each_and_why(tmp_path, job_env):
    if __import__("shutil").which("ssh") is None:
        pytest.skip("no ssh client")
    _hostsfile, discover = _discovery(tmp_path, "localhost:1\nno-such-host.invalid:1")
    result = _objects(
        tmp_path,
        job_env,
        hvdrun_args=(
            "--min-np",
            "2",
            "--host-discovery-script",
            str(discover),
            "--elastic-timeout",
            "1",
        ),
    )
    assert result.returncode == 1, result.output
    assert (
        "error: only 1 slot(s) available (localhost:1), fewer than --min-np 2, after waiting "
        "1 s (--elastic-timeout); lost: no-such-host.invalid (ssh cannot log in to it (ssh: "
        "Could not resolve hostname no-such-host.invalid" in result.stderr
    ), result.output


@pytest.mark.timeout(150)
def test_the_restart_budget_ends_the_job_with_the_failures_code(tmp_path, job_env):
    result = _objects(
        tmp_path,
        job_env,
        "--kill-rank",
        "0",
        "--kill-at",
        "3",
        "--every-launch",
        hvdrun_args=("-np", "2", "--max-restarts", "1"),
    )
    assert result.returncode == 128 + signal.SIGKILL, result.output
    assert "relaunching (restart 1 of 1)" in result.stderr, result.output
    assert "the restart budget is spent (--max-restarts 1)" in result.stderr, result.output
    assert result.stderr.count("launch 1:") == 1 and "launch 2:" not in result.stderr


@pytest.mark.timeout(300)
def test_a_frozen_rank_is_killed_by_the_default_bound_and_the_job_resumes(tmp_path, job_env):
    # Rank 1 stops itself with SIGSTOP mid-epoch and is never continued (a frozen
    # process). No knob is set: an elastic job bounds a stopped rank at 30 s by default,
    # names it, relaunches from the last commit and ends with the uninterrupted weights.
    plain, elastic, script, train = _two_ranks_uninterrupted(tmp_path, job_env)
    result = _hvdrun(
        tmp_path,
        job_env,
        "-np",
        "2",
        "--max-restarts",
        "1",
        PY,
        script,
        *train,
        "--kill-rank",
        "1",
        "--kill-at",
        "5",
        "--freeze",
        "--out",
        str(elastic),
        "--compare-with",
        str(plain / "final.pt"),
        timeout=200,
    )
    log = result.output
    assert result.returncode == 0, log
    assert (
        "rank 1 on host" in log
        and "was stopped (SIGSTOP) for 30 s and never continued: its task wrapper killed it "
        "(--frozen-timeout): relaunching (restart 1 of 1)"
        in log
    ), log
    assert "resuming from commit 3 (epoch=1, batch=0)" in log, log
    assert f"weights equal those of {plain / 'final.pt'}: True" in log, log


@pytest.mark.timeout(200)
def test_a_crashed_rank_on_a_single_host_relaunches_there(tmp_path, job_env):
    # A new user's first elastic job: one host from the discovery script, rank 1 crashes
    # once (os._exit(9)) mid-epoch.  That is a process failure, not the host's: the job
    # resumes on the same host from its last commit and ends as an uninterrupted run does.
    _hostsfile, discover = _discovery(tmp_path, "localhost:2")
    plain, elastic, script, train = _two_ranks_uninterrupted(tmp_path, job_env)
    result = _hvdrun(
        tmp_path,
        job_env,
        "-np",
        "2",
        "--min-np",
        "2",
        "--max-np",
        "2",
        "--host-discovery-script",
        str(discover),
        "--elastic-timeout",
        "5",
        PY,
        script,
        *train,
        "--kill-rank",
        "1",
        "--kill-at",
        "5",
        "--exit-code",
        "9",
        "--out",
        str(elastic),
        "--compare-with",
        str(plain / "final.pt"),
        timeout=120,
    )
    log = result.output
    assert result.returncode == 0, log
    assert "left out" not in log, log
    assert "rank 1 on host localhost exited with code 9: a process failure" in log, log
    assert "resuming from commit 3 (epoch=1, batch=0)" in log, log
    assert f"weights equal those of {plain / 'final.pt'}: True" in log, log
    hostname = __import__("socket").gethostname()
    if hostname != "localhost":  # the report and the decisions name the host alike
        assert f"host {hostname}" not in log, log


@pytest.mark.timeout(150)
def test_a_commit_that_cannot_be_written_ends_the_job_once(tmp_path, job_env):
    # Disk full or a quota: rank 0's write fails (here: a file-size limit, EFBIG). The job
    # ends with its own code and a message naming the file and the error; it is not
    # relaunched and its healthy host is not left out.
    # Under umask 002 (a shared group): the kept state is still the user's alone.
    _hostsfile, discover = _discovery(tmp_path, "localhost:2")
    old = os.umask(0o002)
    try:
        result = _objects(
            tmp_path,
            job_env,
            "--file-size-limit",
            "65536",
            "--ballast",
            "200000",
            "--every-launch",
            hvdrun_args=(
                "--min-np",
                "2",
                "--host-discovery-script",
                str(discover),
                "--elastic-timeout",
                "1",
                "--max-restarts",
                "2",
            ),
        )
    finally:
        os.umask(old)
    assert result.returncode == 74, result.output
    (job_dir,) = (tmp_path / "state").iterdir()
    assert stat.S_IMODE(job_dir.stat().st_mode) == 0o700
    assert {stat.S_IMODE(p.stat().st_mode) for p in job_dir.iterdir()} == {0o600}, list(
        job_dir.iterdir()
    )
    assert (
        "writing commit 1 to " in result.stderr
        and "state.hvdlite failed: File too large (errno 27, EFBIG)" in result.stderr
    ), result.output
    assert "Free space or raise the quota there" in result.stderr
    assert "could not write a commit" in result.stderr and "launch 1:" not in result.stderr
    assert "is left out" not in result.stderr


@pytest.mark.timeout(150)
def test_a_state_directory_rank_0_does_not_share_with_hvdrun_is_refused(tmp_path, job_env):
    # Rank 0 on a host whose --elastic-state-dir is its own local disk: its commits would
    # be invisible to hvdrun (a relaunch starts afresh) or resumed stale later.
    local = tmp_path / "local"
    local.mkdir()
    result = _objects(
        tmp_path,
        job_env,
        "--local-state-dir",
        str(local),
        hvdrun_args=("-np", "2", "--max-restarts", "2"),
    )
    assert result.returncode == 74, result.output
    assert (
        f"the elastic state directory {local} on this host has no marker of job" in result.stderr
        and "on a file system that its host and every rank's host share" in result.stderr
    ), result.output
    assert "launch 1:" not in result.stderr and not any(local.iterdir())


@pytest.mark.timeout(120)
def test_ranks_that_left_with_a_commit_hvdrun_cannot_see_end_the_job(tmp_path, job_env):
    # Every rank exits 75 ("committed, relaunch us") but nothing reached hvdrun's directory:
    # hvdrun says the directory is not shared instead of relaunching from older state.
    result = _hvdrun(
        tmp_path,
        job_env,
        "-np",
        "2",
        "--max-restarts",
        "2",
        PY,
        "-c",
        "import sys; sys.exit(75)",
        timeout=90,
    )
    assert result.returncode == 1, result.output
    assert (
        "but hvdrun sees neither their commit's restart marker nor a new commit in" in result.stderr
        and "rank 0 wrote into a directory hvdrun does not see" in result.stderr
    ), result.output
    assert "launch 1:" not in result.stderr


EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.timeout(200)
@pytest.mark.parametrize(
    "example,keras_backend",
    [
        ("torch_elastic.py", None),
        ("keras_elastic.py", "tensorflow"),
        ("keras_elastic.py", "torch"),
        ("keras_elastic.py", "jax"),
    ],
)
def test_the_elastic_examples_survive_their_simulated_failure(
    tmp_path, job_env, example, keras_backend
):
    if keras_backend is not None:
        pytest.importorskip(keras_backend)
        job_env = {**job_env, "KERAS_BACKEND": keras_backend}
    pytest.importorskip("sklearn")
    script = str(EXAMPLES / example)
    result = _hvdrun(
        tmp_path, job_env, "-np", "2", "--max-restarts", "1", PY, script, "--epochs", "4"
    )
    assert result.returncode == 0, result.output
    out = result.output
    assert "rank 1: simulated failure" in out and "relaunching (restart 1 of 1)" in out, out
    assert "[0] launch 0: 2 rank(s) start at epoch 0" in out
    assert "[0] launch 1: 2 rank(s) start at epoch 1" in out, out  # from the last commit
    accuracy = float(out.split("final test accuracy ")[1].split("%")[0])
    assert accuracy >= 90.0, out
