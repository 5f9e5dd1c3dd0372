"""A real SLURM cluster (one node, this machine): sbatch scripts, srun, hvdrun inside jobs.

The module fixture installs Debian's slurm-wlm and munge (skipping only when
they cannot be installed), starts munged, slurmctld and slurmd with a private
config, and stops exactly those processes at the end.  Deselect with
``-m "not slurm"``.

The launcher/slurm/ scripts run their own default training examples
(examples/torch_digits.py, examples/keras_digits.py: real hvdlite training on
scikit-learn's digits) with TRAIN_ARGS ``--epochs 2 --checkpoint=``
(``HVDLITE_SLURM_TRAIN_ARGS`` overrides it).  ``HVDLITE_SLURM_TORCH_SCRIPT`` /
``HVDLITE_SLURM_TF_SCRIPT`` may name another script (a path relative to the
repository, or ``stand-in`` for helpers_runner/slurm_train.py: numpy + mpi4py
only), and ``HVDLITE_SLURM_EXPECT`` is a regular expression the output must
contain (default: ``training finished|final test accuracy``).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from helpers_runner import slurm_cluster
from helpers_runner.common import HELPERS, RANKS, ROOT, clean_env, hvdrun_cmd, run

pytestmark = pytest.mark.slurm

SCRIPTS = ROOT / "launcher" / "slurm"
STAND_IN = HELPERS / "slurm_train.py"
EXPECT = os.environ.get("HVDLITE_SLURM_EXPECT", "training finished|final test accuracy")
JOB_TIMEOUT = float(os.environ.get("HVDLITE_SLURM_JOB_TIMEOUT", "240"))
BATCH_SCRIPTS = {
    "single_node_torch": "HVDLITE_SLURM_TORCH_SCRIPT",
    "multi_node_torch": "HVDLITE_SLURM_TORCH_SCRIPT",
    "single_node_tensorflow": "HVDLITE_SLURM_TF_SCRIPT",
    "multi_node_tensorflow": "HVDLITE_SLURM_TF_SCRIPT",
}
#: the Lightning example, through the torch batch script (hvdrun inside the job)
LIGHTNING = "examples/lightning_digits.py"
LIGHTNING_JOB = "single_node_lightning"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = slurm_cluster.install()
    if reason:
        pytest.skip(f"no SLURM cluster: {reason}")
    workdir = tmp_path_factory.mktemp("slurm")
    one_node = slurm_cluster.OneNodeCluster(workdir)
    try:
        one_node.start()
        yield one_node
    finally:
        one_node.stop()


@pytest.fixture(scope="module")
def job_env(cluster, tmp_path_factory):
    """The environment jobs are submitted with: `hvdrun` and this Python first on PATH."""
    shims = tmp_path_factory.mktemp("bin")
    hvdrun = shims / "hvdrun"
    hvdrun.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m hvdlite.runner "$@"\n')
    hvdrun.chmod(0o755)
    path = os.pathsep.join(
        [str(shims), str(Path(sys.executable).parent), os.environ.get("PATH", "/usr/bin:/bin")]
    )
    return clean_env(SLURM_CONF=str(cluster.conf), PATH=path)


@pytest.fixture(scope="module")
def batch_jobs(cluster, job_env, tmp_path_factory):
    """Submit every launcher/slurm script (2 tasks on the one node) at once; name -> (id, out)."""
    outdir = tmp_path_factory.mktemp("jobs")
    jobs = {}
    for name, variable in BATCH_SCRIPTS.items():
        env = dict(job_env)
        choice = os.environ.get(variable, "default")
        if choice == "stand-in":
            env["TRAIN_SCRIPT"] = str(STAND_IN)
        else:
            if choice != "default":
                env["TRAIN_SCRIPT"] = choice
            env["TRAIN_ARGS"] = os.environ.get(
                "HVDLITE_SLURM_TRAIN_ARGS", "--epochs 2 --checkpoint="
            )
        jobs[name] = _sbatch(cluster, f"{name}.sbatch", env, outdir / f"{name}.out")
    if _has_lightning():
        env = dict(job_env, TRAIN_SCRIPT=LIGHTNING)
        env["TRAIN_ARGS"] = f"--epochs 2 --checkpoint-dir {outdir / 'lightning'}"
        out = outdir / f"{LIGHTNING_JOB}.out"
        jobs[LIGHTNING_JOB] = _sbatch(cluster, "single_node_torch.sbatch", env, out)
    return jobs


def _sbatch(cluster, script: str, env: dict, out: Path) -> tuple[str, Path]:
    """Submit launcher/slurm/*script* for 2 tasks on the one node: (job id, output file)."""
    options = ["--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1", f"--chdir={ROOT}"]
    job_id = cluster.sbatch([*options, f"--output={out}", str(SCRIPTS / script)], env=env)
    return job_id, out


def _has_lightning() -> bool:
    import importlib.util

    return importlib.util.find_spec("lightning") is not None


def _finished(cluster, job_id: str, out: Path) -> str:
    fields = cluster.wait_job(job_id, JOB_TIMEOUT)
    text = out.read_text(errors="replace") if out.exists() else "<no output file>"
    assert fields.get("JobState") == "COMPLETED", f"{fields.get('JobState')}:\n{text}"
    assert fields.get("ExitCode") == "0:0", text
    return text


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", list(BATCH_SCRIPTS))
def test_sbatch_script(cluster, batch_jobs, name):
    job_id, out = batch_jobs[name]
    text = _finished(cluster, job_id, out)
    assert f"job {job_id}: 2 ranks on {cluster.host}" in text, text
    assert "hvdrun: 2 rank(s) on this machine" in text, text  # hvdrun read the allocation
    assert re.search(r"^\[0\] ", text, re.M), text  # rank output passed through, prefixed
    choice = os.environ.get(BATCH_SCRIPTS[name], "default")
    if choice == "stand-in":
        for rank in (0, 1):
            assert f"[{rank}] rank {rank} of 2 (local rank {rank})" in text, text
            assert f"[{rank}] rank {rank} of 2: training finished" in text, text
    else:
        if choice == "default":  # the digits examples: hvd.size() is 2, training ran to the end
            assert re.search(r"^\[0\] training on 2 rank\(s\)", text, re.M), text
        assert re.search(EXPECT, text), text


@pytest.mark.timeout(600)
def test_a_lightning_job_trains_with_the_hvdlite_strategy(cluster, batch_jobs):
    if LIGHTNING_JOB not in batch_jobs:
        pytest.skip("lightning is not installed (pip install hvdlite[lightning])")
    job_id, out = batch_jobs[LIGHTNING_JOB]
    text = _finished(cluster, job_id, out)
    assert "hvdrun: 2 rank(s) on this machine" in text, text
    # Lightning's world is hvdlite's: 2 ranks, and only global rank 0 prints
    assert re.search(r"^\[0\] training on 2 rank\(s\)", text, re.M), text
    assert not re.search(r"^\[1\] (training on|final test accuracy)", text, re.M), text
    assert re.search(r"^\[0\] final test accuracy \d+\.\d+% after 2 epochs", text, re.M), text


@pytest.mark.timeout(300)
def test_lightning_under_srun_without_hvdrun(cluster, job_env, tmp_path):
    if not _has_lightning():
        pytest.skip("lightning is not installed (pip install hvdlite[lightning])")
    result = run(
        ["srun", "--mpi=pmi2", "--kill-on-bad-exit=1", "-n", "2", sys.executable]
        + [str(ROOT / LIGHTNING), "--epochs", "1", "--checkpoint-dir", str(tmp_path)],
        env=job_env,
        timeout=JOB_TIMEOUT,
    )
    assert result.returncode == 0, result.output
    assert "training on 2 rank(s)" in result.stdout, result.output
    assert result.stdout.count("final test accuracy") == 1, result.output  # rank 0 alone
    assert (tmp_path / "last.ckpt").is_file(), result.output


@pytest.mark.timeout(300)
def test_srun_starts_ranks_without_hvdrun(cluster, job_env):
    result = run(
        ["srun", "--mpi=pmi2", "--kill-on-bad-exit=1", "-n", "2", sys.executable, str(STAND_IN)],
        env=job_env,
        timeout=JOB_TIMEOUT,
    )
    assert result.returncode == 0, result.output
    for rank in (0, 1):
        assert f"rank {rank} of 2 (local rank {rank})" in result.stdout, result.output
        assert f"rank {rank} of 2: training finished" in result.stdout, result.output


@pytest.mark.timeout(300)
def test_rank_environment_under_srun(cluster, job_env):
    code = (
        "from hvdlite.runner.rankenv import from_environ; from mpi4py import MPI; "
        "e = from_environ(); c = MPI.COMM_WORLD; "
        "print('check', c.Get_rank(), c.Get_size(), e.rank, e.size, e.local_rank, "
        "e.local_size, e.source)"
    )
    result = run(
        ["srun", "--mpi=pmi2", "--kill-on-bad-exit=1", "-n", "2", sys.executable, "-c", code],
        env=job_env,
        timeout=JOB_TIMEOUT,
    )
    assert result.returncode == 0, result.output
    lines = sorted(line for line in result.stdout.splitlines() if line.startswith("check"))
    assert lines == ["check 0 2 0 2 0 2 pmi", "check 1 2 1 2 1 2 pmi"], result.output


@pytest.mark.timeout(300)
def test_mpiexec_in_batch_job_without_hvdrun(cluster, job_env, tmp_path):
    out = tmp_path / "mpiexec.out"
    job_id = cluster.sbatch(
        [
            "--ntasks=2",
            f"--chdir={ROOT}",
            f"--output={out}",
            f'--wrap=mpiexec -n "$SLURM_NTASKS" "{sys.executable}" "{STAND_IN}"',
        ],
        env=job_env,
    )
    text = _finished(cluster, job_id, out)
    for rank in (0, 1):
        assert f"rank {rank} of 2: training finished" in text, text


@pytest.mark.timeout(300)
def test_hvdrun_launcher_srun_inside_allocation(cluster, job_env, tmp_path):
    out = tmp_path / "srun.out"
    command = " ".join(hvdrun_cmd("--launcher", "srun", sys.executable, str(RANKS), "ok"))
    job_id = cluster.sbatch(
        ["--ntasks=2", f"--chdir={ROOT}", f"--output={out}", f"--wrap={command}"], env=job_env
    )
    text = _finished(cluster, job_id, out)
    for rank in (0, 1):  # srun --label prefixes
        assert f"{rank}: rank {rank} of 2 sum 1" in text, text


@pytest.mark.timeout(300)
def test_hvdrun_launcher_srun_reports_a_failed_rank(cluster, job_env):
    result = run(
        hvdrun_cmd("--launcher", "srun", "-np", "2", sys.executable, str(RANKS), "exit", "1"),
        env=job_env,
        timeout=JOB_TIMEOUT,
    )
    assert result.returncode == 1, result.output
    assert result.seconds < 30, result.seconds
    assert f"rank 1 on host {cluster.host} exited with code 1" in result.stderr, result.output
    assert "rank 1 is about to fail" in result.stderr
