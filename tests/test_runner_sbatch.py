"""The launcher/slurm/ batch scripts under plain bash, no SLURM: what reaches hvdrun.

A stand-in ``hvdrun`` on PATH prints its arguments, one per line; the SLURM
variables the scripts echo are set by hand.  Each script runs in a directory
full of files that a wildcard would match, so an argument that was expanded
(or split) shows up as a difference.  tests/test_slurm.py runs the scripts for
real under a one-node cluster.
"""

import os
import shutil
from pathlib import Path

import pytest
from helpers_runner.common import ROOT, run

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash"),
]

SCRIPTS = sorted((ROOT / "launcher" / "slurm").glob("*.sbatch"))
SLURM = {
    "SLURM_JOB_ID": "7",
    "SLURM_NTASKS": "2",
    "SLURM_JOB_NODELIST": "node1",
    "SLURM_TASKS_PER_NODE": "2",
    "SLURM_CPUS_PER_TASK": "1",
}


def _hvdrun_args(script: Path, tmp_path: Path, args=(), **env) -> list[str]:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    shim = bindir / "hvdrun"
    shim.write_text('#!/bin/sh\nfor arg in "$@"; do printf \'<%s>\\n\' "$arg"; done\n')
    shim.chmod(0o755)
    workdir = tmp_path / "work"
    workdir.mkdir(exist_ok=True)
    for name in ("a.txt", "b.txt", "--lr", "train.py", "x y"):
        (workdir / name).write_text("")
    environ = {
        "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
        **SLURM,
        "TRAIN_SCRIPT": "train.py",
        **env,
    }
    result = run(["bash", str(script), *args], env=environ, cwd=workdir)
    assert result.returncode == 0, result.output
    lines = [line for line in result.stdout.splitlines() if line.startswith("<")]
    return [line[1:-1] for line in lines]


def test_every_script_is_covered():
    assert len(SCRIPTS) == 4


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_train_args_reach_the_script_verbatim(script, tmp_path):
    args = _hvdrun_args(script, tmp_path, TRAIN_ARGS="--files *.txt --glob * --lr 0.1")
    assert args == [
        "--verbose",
        "python",
        "train.py",
        "--files",
        "*.txt",
        "--glob",
        "*",
        "--lr",
        "0.1",
    ]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_arguments_after_the_script_win_and_keep_spaces(script, tmp_path):
    args = _hvdrun_args(
        script, tmp_path, ["--run-name", "my run", "*", "x y"], TRAIN_ARGS="--ignored"
    )
    assert args == ["--verbose", "python", "train.py", "--run-name", "my run", "*", "x y"]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_no_arguments(script, tmp_path):
    assert _hvdrun_args(script, tmp_path) == ["--verbose", "python", "train.py"]
    assert _hvdrun_args(script, tmp_path, TRAIN_ARGS="  \n ") == ["--verbose", "python", "train.py"]
