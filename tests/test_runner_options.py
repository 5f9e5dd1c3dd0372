"""Unit tests: flags from the knob table, --config-file precedence, and launch planning."""

import sys
from pathlib import Path

import pytest

from hvdlite.config import KNOBS
from helpers_runner.common import cli_launch as _plan
from helpers_runner.common import genv as _genv

from hvdlite.runner import cli, configfile, mpi, options
from hvdlite.runner.errors import UsageError

PY = sys.executable  # an executable that surely exists, as the user's command


def test_every_knob_has_a_flag():
    # A knob whose flag a hand-written option has (e.g. --thread-affinity) is set by it.
    flags = {opt.variable: opt.flags[0] for opt in options.OPTIONS if opt.variable}
    assert set(flags) >= {knob.env for knob in KNOBS}
    assert flags["HVDLITE_FUSION_THRESHOLD"] == "--fusion-threshold-mb"
    assert flags["HVDLITE_CYCLE_TIME"] == "--cycle-time-ms"
    assert flags["HVDLITE_STALL_CHECK_DISABLE"] == "--no-stall-check"
    assert flags["HVDLITE_STALL_CHECK_TIME_SECONDS"] == "--stall-check-warning-time-seconds"
    assert flags["HVDLITE_STALL_SHUTDOWN_TIME_SECONDS"] == "--stall-check-shutdown-time-seconds"
    assert flags["HVDLITE_TIMELINE"] == "--timeline-filename"
    assert flags["HVDLITE_MPI_THREADS_DISABLE"] == "--mpi-threads-disable"


def test_knob_flags_become_variables():
    args = options.parse_args(
        [
            "-np",
            "2",
            "--fusion-threshold-mb",
            "1.5",
            "--cycle-time-ms",
            "3.5",
            "--cache-capacity",
            "0",
            "--hierarchical-allreduce",
            "--hierarchical-allgather",
            "--timeline-filename",
            "tl.json",
            "--timeline-mark-cycles",
            "--no-stall-check",
            "--stall-check-warning-time-seconds",
            "30",
            "--stall-check-shutdown-time-seconds",
            "90",
            "--mpi-threads-disable",
            "--log-level",
            "debug",
            "python",
            "train.py",
            "--lr",
            "1",
        ]
    )
    env = options.knob_environment(options.merge(args, {}))
    assert env == {
        "HVDLITE_FUSION_THRESHOLD": str(int(1.5 * 1024 * 1024)),
        "HVDLITE_CYCLE_TIME": "3.5",
        "HVDLITE_CACHE_CAPACITY": "0",
        "HVDLITE_HIERARCHICAL_ALLREDUCE": "1",
        "HVDLITE_HIERARCHICAL_ALLGATHER": "1",
        "HVDLITE_TIMELINE": "tl.json",
        "HVDLITE_TIMELINE_MARK_CYCLES": "1",
        "HVDLITE_STALL_CHECK_DISABLE": "1",
        "HVDLITE_STALL_CHECK_TIME_SECONDS": "30.0",
        "HVDLITE_STALL_SHUTDOWN_TIME_SECONDS": "90.0",
        "HVDLITE_MPI_THREADS_DISABLE": "1",
        "HVDLITE_LOG_LEVEL": "DEBUG",
    }
    assert args.command == ["python", "train.py", "--lr", "1"]


def test_np_written_together_with_its_number():
    # "-np2" reaches argparse as -n with the value "p2": it means 2.
    assert options.parse_args(["-np2", "python"]).np == 2
    assert options.parse_args(["-np16", "python", "-np2"]).command == ["python", "-np2"]
    assert options.parse_args(["-n", "3", "python"]).np == 3
    with pytest.raises(UsageError, match="'px' is not a number"):
        options.parse_args(["-npx", "python"])


def test_a_python_script_without_python_gets_the_line_that_runs_it(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    with pytest.raises(UsageError) as info:
        _plan(["-np", "2", "train.py", "--lr", "0.1"])
    assert str(info.value) == (
        "command not found: train.py (not on PATH); "
        "did you mean `hvdrun -np 2 python train.py --lr 0.1`?"
    )
    with pytest.raises(UsageError) as info:
        _plan(["-np", "2", "--verbose", "--", str(script)])
    assert "not executable" in str(info.value)
    assert f"did you mean `hvdrun -np 2 --verbose python {script}`?" in str(info.value)
    with pytest.raises(UsageError) as info:
        _plan(["-np", "2", "no-such-program"])
    assert "did you mean" not in str(info.value)  # only for .py files


def test_torchrun_variables_from_what_the_launcher_said():
    from hvdlite.runner.rankenv import RankEnv, torchrun_variables

    assert torchrun_variables(RankEnv(3, 4, 1, 2, "pmi")) == {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
    }
    assert torchrun_variables(RankEnv(3, 4, None, None, "pmix")) == {"RANK": "3", "WORLD_SIZE": "4"}
    assert torchrun_variables(None) == {}


def test_master_address_and_port_only_when_asked():
    assert "MASTER_PORT" not in _genv(_plan(["-np", "2", PY]))
    plan = _plan(["-np", "2", "--master-port", "29501", PY])
    assert _genv(plan)["MASTER_PORT"] == "29501" and _genv(plan)["MASTER_ADDR"] == "127.0.0.1"
    assert "MASTER_ADDR=127.0.0.1" in plan.shell_line()  # not a secret: shown
    plan = _plan(["-H", "n1:2,n2:2", "--master-port", "29501", PY])
    assert plan.env["MASTER_ADDR"] == "n1"  # rank 0's host
    plan = _plan(["-np", "2", "--master-port", "29501", "--master-addr", "10.0.0.5", PY])
    assert plan.env["MASTER_ADDR"] == "10.0.0.5"
    with pytest.raises(UsageError, match="--master-port"):
        _plan(["-np", "2", "--master-port", "70000", PY])


def test_command_flags_are_not_hvdruns():
    args = options.parse_args(["-np", "2", "--", "python", "-np", "--verbose"])
    assert args.command == ["python", "-np", "--verbose"] and args.verbose is None


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--bogus", "-np", "2", "python"], "unrecognized arguments: --bogus"),
        (["-np", "0", "python"], "-np"),
        (["-np", "two", "python"], "-np"),
        (["--cycle-time-ms", "-1", "python"], "--cycle-time-ms"),
        (["--log-level", "LOUD", "python"], "--log-level"),
        (["--launcher", "ssh", "python"], "--launcher"),
        (["--overlap", "sometimes", "python"], "--overlap"),
        (["--fusion", "1", "python"], "unrecognized"),  # no abbreviations
    ],
)
def test_bad_flags_are_one_line_usage_errors(argv, message):
    with pytest.raises(UsageError) as info:
        options.parse_args(argv)
    assert message in str(info.value) and "\n" not in str(info.value)


NUMERIC_FLAGS = [
    opt.flags[0]
    for opt in options.OPTIONS
    if getattr(opt.convert, "__name__", "") in ("int", "float")
]


def test_numeric_flags_are_all_found():
    assert {
        "-np",
        "--start-timeout",
        "--fusion-threshold-mb",
        "--cycle-time-ms",
        "--cache-capacity",
        "--stall-check-warning-time-seconds",
        "--stall-check-shutdown-time-seconds",
    } <= set(NUMERIC_FLAGS)


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "Infinity", "-1", "1e999"])
@pytest.mark.parametrize("flag", NUMERIC_FLAGS)
def test_numeric_flags_reject_non_finite_and_negative(flag, value):
    with pytest.raises(UsageError) as info:
        options.parse_args([flag, value, "python"])
    assert flag in str(info.value) and "\n" not in str(info.value)


def test_numeric_flag_ranges():
    with pytest.raises(UsageError, match="at most 1048576"):
        options.parse_args(["--fusion-threshold-mb", "1e9", "python"])
    with pytest.raises(UsageError, match="more than 0"):
        options.parse_args(["--start-timeout", "0", "python"])
    args = options.parse_args(
        ["--fusion-threshold-mb", "0", "--start-timeout", "0.5", "--cycle-time-ms", "0", "python"]
    )
    assert (args.fusion_threshold, args.start_timeout, args.cycle_time_ms) == (0, 0.5, 0)


@pytest.mark.parametrize(
    "text",
    [
        "fusion-threshold-mb: .nan\n",
        "start-timeout: .inf\n",
        "cycle-time-ms: -.inf\n",
        "num-proc: .nan\n",
    ],
)
def test_config_file_rejects_non_finite_numbers(tmp_path, text):
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    with pytest.raises(UsageError, match=text.split(":")[0]):
        configfile.read_config_file(str(config))


def test_config_file_precedence(tmp_path):
    config = tmp_path / "hvd.yaml"
    config.write_text(
        "fusion-threshold-mb: 8\n"
        "cycle_time_ms: 5\n"  # '_' spelling works too
        "cache-capacity: 20\n"
        "hierarchical-allreduce: false\n"
        "log-level: info\n"
        "np: 2\n"
        "mpi-args: [-iface, lo]\n"
    )
    plan = _plan(
        ["--config-file", str(config), "--cycle-time-ms", "7", PY, "x.py"],
        HVDLITE_CACHE_CAPACITY="10",  # the file beats the environment
        HOROVOD_HIERARCHICAL_ALLREDUCE="1",  # ... in either spelling
        HOROVOD_TIMELINE="/tmp/keep.json",
    )  # untouched when nobody sets it
    assert plan.np == 2
    genv = _genv(plan)
    assert genv == {
        "HVDLITE_FUSION_THRESHOLD": str(8 * 1024 * 1024),
        "HVDLITE_CYCLE_TIME": "7.0",  # the command line beats the file
        "HVDLITE_CACHE_CAPACITY": "20",
        "HVDLITE_HIERARCHICAL_ALLREDUCE": "0",
        "HVDLITE_LOG_LEVEL": "INFO",
    }
    assert plan.env["HVDLITE_CACHE_CAPACITY"] == "20"
    assert plan.env["HOROVOD_TIMELINE"] == "/tmp/keep.json"
    assert "HVDLITE_TIMELINE" not in plan.env
    assert plan.cmd[plan.cmd.index("-iface") + 1] == "lo"


@pytest.mark.parametrize(
    "text,message",
    [
        ("fusion-thresold-mb: 8\n", "unknown key"),
        ("cycle-time-ms: fast\n", "cycle-time-ms"),
        ("hierarchical-allreduce: maybe\n", "true or false"),
        ("- a\n- b\n", "mapping"),
        ("a: [\n", "not valid YAML"),
    ],
)
def test_config_file_errors(tmp_path, text, message):
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    with pytest.raises(UsageError, match=message):
        configfile.read_config_file(str(config))


def test_plan_hosts_and_slots():
    plan = _plan(["-H", "n1:2,n2:2", "-np", "3", PY])
    assert plan.np == 3 and "-hosts" in plan.cmd
    assert plan.cmd[plan.cmd.index("-hosts") + 1] == "n1:2,n2:1"
    assert _plan(["-H", "n1:2,n2:2", PY]).np == 4
    with pytest.raises(UsageError, match="more than the 4 slot"):
        _plan(["-H", "n1:2,n2:2", "-np", "5", PY])
    with pytest.raises(UsageError, match="not both"):
        _plan(["-H", "n1:2", "--hostfile", "f", PY])
    with pytest.raises(UsageError, match="-np is required"):
        _plan([PY])


def test_plan_from_slurm_allocation():
    slurm_env = {
        "SLURM_JOB_ID": "9",
        "SLURM_JOB_NODELIST": "node[1-2]",
        "SLURM_TASKS_PER_NODE": "2(x2)",
    }
    plan = _plan([PY, "train.py"], **slurm_env)
    assert plan.np == 4 and plan.cmd[plan.cmd.index("-hosts") + 1] == "node1:2,node2:2"
    assert _plan(["-np", "3", PY], **slurm_env).np == 3
    with pytest.raises(UsageError, match="more than the 4 slot"):
        _plan(["-np", "5", PY], **slurm_env)
    # -H beats the allocation.
    assert _plan(["-H", "other:1", PY], **slurm_env).cmd[4] == "other:1"


def test_plan_local_run_has_no_host_list():
    plan = _plan(["-H", "localhost:3", PY])
    assert plan.np == 3 and "-hosts" not in plan.cmd and plan.hosts is None


def test_plan_rejects_missing_command_and_mpi(tmp_path, monkeypatch):
    with pytest.raises(UsageError, match="command not found: no-such-program"):
        _plan(["-np", "2", "no-such-program"])
    with pytest.raises(UsageError, match="not executable"):
        _plan(["-np", "2", str(tmp_path / "missing.sh")])
    with pytest.raises(UsageError, match="no command"):
        _plan(["-np", "2"])
    monkeypatch.setattr(mpi.sys, "executable", str(tmp_path / "python"))
    with pytest.raises(UsageError, match=r"pip install hvdlite\[mpich\]"):
        _plan(["-np", "2", PY], PATH=str(tmp_path))


def test_plan_srun_launcher(tmp_path):
    srun = tmp_path / "srun"
    srun.write_text("#!/bin/sh\nexit 0\n")
    srun.chmod(0o755)
    slurm_env = {
        "SLURM_JOB_ID": "9",
        "SLURM_JOB_NODELIST": "node[1-2]",
        "SLURM_TASKS_PER_NODE": "2(x2)",
        "PATH": f"{tmp_path}:/usr/bin:/bin",
    }
    plan = _plan(["--launcher", "srun", "--log-level", "info", PY], **slurm_env)
    assert plan.cmd[:3] == [str(srun), "--mpi=pmi2", "--ntasks=4"]
    assert not any(arg.startswith("--nodelist") for arg in plan.cmd)  # srun knows the nodes
    assert plan.env["HVDLITE_LOG_LEVEL"] == "INFO"
    assert plan.shell_line().startswith("HVDLITE_LOG_LEVEL=INFO ")
    with pytest.raises(UsageError, match="srun is not on PATH"):
        _plan(["--launcher", "srun", "-np", "2", PY], PATH=str(tmp_path / "empty"))


def test_start_timeout_sources():
    assert _plan(["-np", "1", PY]).start_timeout == cli.DEFAULT_START_TIMEOUT
    assert _plan(["-np", "1", PY], HOROVOD_START_TIMEOUT="12").start_timeout == 12
    assert (
        _plan(["-np", "1", "--start-timeout", "5", PY], HOROVOD_START_TIMEOUT="12").start_timeout
        == 5
    )
    for raw in ("nan", "inf"):
        with pytest.raises(UsageError, match="not a finite number of seconds"):
            _plan(["-np", "1", PY], HOROVOD_START_TIMEOUT=raw)


def test_plan_carries_the_job_variables():
    env = _plan(["-np", "1", PY]).env
    assert len(env["HVDLITE_JOB_TOKEN"]) >= 16 and env["HVDLITE_JOB_OWNER"]
    assert _plan(["-np", "1", PY]).env["HVDLITE_JOB_TOKEN"] != env["HVDLITE_JOB_TOKEN"]


def test_the_frozen_bound_is_on_by_default_in_elastic_launches_only():
    from hvdlite.runner import cli
    from hvdlite.runner.hosts import Host

    def bound(argv, placement=None):
        _args, plan = cli.prepare([*argv, PY], {"PATH": "/usr/bin:/bin"}, placement=placement)
        after = plan.cmd.index("--frozen-after") if "--frozen-after" in plan.cmd else None
        return None if after is None else plan.cmd[after + 1]

    elastic = (2, [Host("localhost", 2)])
    assert bound(["-np", "2"]) is None
    assert bound(["-np", "2", "--frozen-timeout", "12.5"]) == "12.5"
    assert bound(["-np", "2"], elastic) == f"{cli.ELASTIC_FROZEN_TIMEOUT:g}" == "30"
    assert bound(["-np", "2", "--frozen-timeout", "0"], elastic) is None
    assert bound(["-np", "2", "--frozen-timeout", "5"], elastic) == "5"


def test_the_silent_host_bound_is_on_by_default_in_elastic_launches_only():
    from hvdlite.runner import cli, protocol
    from hvdlite.runner.hosts import Host

    def beat(argv, placement=None):
        _args, plan = cli.prepare([*argv, PY], {"PATH": "/usr/bin:/bin"}, placement=placement)
        after = plan.cmd.index("--beat") if "--beat" in plan.cmd else None
        return plan.silent_timeout, None if after is None else float(plan.cmd[after + 1])

    elastic = (2, [Host("localhost", 2)])
    assert beat(["-np", "2"]) == (0.0, None)
    assert beat(["-np", "2", "--silent-host-timeout", "12"]) == (12.0, 2.0)
    assert beat(["-np", "2"], elastic) == (cli.ELASTIC_SILENT_HOST_TIMEOUT, 5.0)
    assert cli.ELASTIC_SILENT_HOST_TIMEOUT == 30.0
    assert beat(["-np", "2", "--silent-host-timeout", "0"], elastic) == (0.0, None)
    assert protocol.beat_interval(1.0) == 0.5  # never more often than twice a second


def test_as_horovod_puts_the_stand_in_first_on_the_ranks_path_and_only_then(tmp_path):
    from hvdlite import horovod_compat

    stand_in = horovod_compat.PATH
    plan = _plan(["--as-horovod", "-np", "2", PY], PYTHONPATH="/mine")
    assert _genv(plan)["PYTHONPATH"] == f"{stand_in}:/mine"
    assert f"PYTHONPATH={stand_in}:/mine " in plan.shell_line()  # shown by --dry-run
    assert (Path(stand_in) / "horovod" / "__init__.py").is_file()
    assert _genv(_plan(["--as-horovod", "-np", "2", PY]))["PYTHONPATH"] == stand_in
    plain = _plan(["-np", "2", PY], PYTHONPATH="/mine")
    assert "PYTHONPATH" not in _genv(plain) and stand_in not in plain.shell_line()
    config = tmp_path / "hvd.yaml"
    config.write_text("as-horovod: true\n")
    from_file = _plan(["--config-file", str(config), "-np", "2", PY])
    assert _genv(from_file)["PYTHONPATH"] == stand_in


def test_python_m_hvdlite_horovodrun_is_hvdrun_as_horovod(capsys):
    from hvdlite import horovod_compat, horovodrun

    assert horovodrun.main(["-np", "2", "--dry-run", PY, "train.py"]) == 0
    line = capsys.readouterr().out
    assert f"PYTHONPATH={horovod_compat.PATH}" in line and line.rstrip().endswith("train.py")
