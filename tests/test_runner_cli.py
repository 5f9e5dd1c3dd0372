"""hvdrun as a program: --version, --help, --dry-run, --check-build, and bad input (exit 2)."""

import configparser
import sys

import pytest
from helpers_runner.common import ROOT, clean_env, hvdrun, run

from hvdlite.version import __version__


@pytest.mark.timeout(60)
def test_version():
    result = hvdrun("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"hvdrun (hvdlite) {__version__}"


@pytest.mark.timeout(60)
def test_help_lists_the_knob_flags():
    result = hvdrun("--help")
    assert result.returncode == 0
    for flag in (
        "-np",
        "--hosts",
        "--hostfile",
        "--mpi-args",
        "--check-build",
        "--dry-run",
        "--verbose",
        "--start-timeout",
        "--output-filename",
        "--config-file",
        "--fusion-threshold-mb",
        "--cycle-time-ms",
        "--cache-capacity",
        "--hierarchical-allreduce",
        "--hierarchical-allgather",
        "--timeline-filename",
        "--timeline-mark-cycles",
        "--no-stall-check",
        "--stall-check-warning-time-seconds",
        "--stall-check-shutdown-time-seconds",
        "--mpi-threads-disable",
        "--log-level",
        "--launcher",
    ):
        assert flag in result.stdout, flag


def test_console_script_points_at_main():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    assert "hvdrun = hvdlite.runner.cli:main" in cfg["options.entry_points"]["console_scripts"]
    from hvdlite.runner.cli import main

    assert callable(main)


@pytest.mark.timeout(60)
def test_import_does_not_touch_mpi_or_frameworks():
    code = (
        "import sys, hvdlite.runner, hvdlite.runner.cli, hvdlite.runner.job; "
        "print(sorted(m for m in ('mpi4py', 'torch', 'tensorflow', 'numpy') "
        "if m in sys.modules))"
    )
    result = run([sys.executable, "-c", code])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "argv,message",
    [
        (["--bogus", "-np", "2", sys.executable], "unrecognized arguments: --bogus"),
        (["-np", "3", "-H", "localhost:2", sys.executable], "more than the 2 slot"),
        (["-H", "node1:two", sys.executable], "positive integer"),
        (["--hostfile", "/nonexistent/hosts", sys.executable], "cannot read"),
        (["-np", "2", "no-such-command-hvdlite"], "command not found"),
        (["-np", "2"], "no command given"),
        ([sys.executable], "-np is required"),
        (["--fusion-threshold-mb", "nan", "-np", "2", sys.executable], "not a finite number"),
        (["--start-timeout", "nan", "-np", "2", sys.executable], "not a finite number"),
        (["--cycle-time-ms", "inf", "-np", "2", sys.executable], "not a finite number"),
        (["-np", "-1", sys.executable], "must be at least 1"),
    ],
    ids=[
        "unknown-flag",
        "np-over-slots",
        "bad-hosts",
        "bad-hostfile",
        "no-command-found",
        "no-command",
        "no-np",
        "fusion-nan",
        "start-timeout-nan",
        "cycle-time-inf",
        "np-neg",
    ],
)
def test_bad_input_exits_2_with_one_line(argv, message):
    result = hvdrun(*argv)
    assert result.returncode == 2, result.output
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("hvdrun: error:"), result.stderr
    assert message in lines[0]


@pytest.mark.timeout(60)
def test_dry_run_prints_and_starts_nothing(tmp_path):
    marker = tmp_path / "ran"
    result = hvdrun(
        "-np",
        "2",
        "--dry-run",
        "--cycle-time-ms",
        "4",
        sys.executable,
        "-c",
        f"open({str(marker)!r}, 'w')",
    )
    assert result.returncode == 0, result.output
    line = result.stdout.strip()
    assert "mpiexec" in line and "-n 2" in line and "-prepend-rank" in line
    assert line.startswith("HVDLITE_CYCLE_TIME=4.0 ") and "task_wrapper.py" in line
    assert not marker.exists()


@pytest.mark.timeout(240)
def test_check_build_table():
    result = run(
        [sys.executable, "-m", "hvdlite.runner", "--check-build"], timeout=200, env=clean_env()
    )
    assert result.returncode == 0, result.output
    out = result.stdout
    for label in (
        "MPI",
        "launcher",
        "library",
        "thread level",
        "Frameworks",
        "PyTorch",
        "TensorFlow",
        "GPU",
        "CUDA",
        "NCCL",
    ):
        assert label in out, (label, out)
    assert "[X] MPICH" in out or "[X] Open MPI" in out or "[X] Intel" in out, out
    assert "MPI_THREAD_" in out
