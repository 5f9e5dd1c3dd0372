"""Unit tests: MPI detection and the command line built for each MPI flavour and srun."""

import os
import stat

import pytest

from hvdlite.runner import mpi
from hvdlite.runner.command import (
    LaunchSpec,
    forwarded_names,
    mpiexec_command,
    srun_command,
    srun_mpi_plugin,
)
from hvdlite.runner.errors import UsageError
from hvdlite.runner.hosts import Host

PROGRAM = ["python", "wrapper.py", "--", "python", "train.py", "--lr", "0.1"]
KNOBS = {"HVDLITE_CYCLE_TIME": "5", "HVDLITE_TIMELINE": "/tmp/t l.json"}
MPICH = mpi.MpiInfo("/opt/mpich/bin/mpiexec", "mpich", "4.2.0")
OPENMPI = mpi.MpiInfo("/opt/ompi/bin/mpirun", "openmpi", "5.0.3")
INTEL = mpi.MpiInfo("/opt/intel/bin/mpiexec", "intel", "2021.10")


@pytest.mark.parametrize(
    "text,expected",
    [
        (
            "HYDRA build details:\n    Version:                                 5.0.2\n",
            ("mpich", "5.0.2"),
        ),
        ("mpiexec (Open MPI) 5.0.11\n\nReport bugs to the Open MPI team\n", ("openmpi", "5.0.11")),
        ("mpirun (Open MPI) 4.1.4\n", ("openmpi", "4.1.4")),
        ("mpiexec (OpenRTE) 4.0.3\n", ("openmpi", "4.0.3")),
        (
            "Intel(R) MPI Library for Linux* OS, Version 2021.10 Build 20230619 (id: c2e19c2f3e)\n",
            ("intel", "2021.10"),
        ),
        ("something else entirely\n", None),
    ],
)
def test_parse_version_text(text, expected):
    assert mpi.parse_version_text(text) == expected


def test_mpich_command():
    spec = LaunchSpec(
        np=4,
        program=PROGRAM,
        hosts=[Host("a", 2), Host("b", 2)],
        env=KNOBS,
        mpi_args=["-iface", "ib0"],
    )
    assert mpiexec_command(MPICH, spec) == [
        "/opt/mpich/bin/mpiexec",
        "-n",
        "4",
        "-hosts",
        "a:2,b:2",
        "-bind-to",
        "none",
        "-prepend-rank",
        "-iface",
        "ib0",
        *PROGRAM,
    ]  # the knobs: in mpiexec's environment


def test_mpich_command_local():
    cmd = mpiexec_command(MPICH, LaunchSpec(np=2, program=PROGRAM))
    assert cmd == [
        "/opt/mpich/bin/mpiexec",
        "-n",
        "2",
        "-bind-to",
        "none",
        "-prepend-rank",
        *PROGRAM,
    ]


def test_openmpi_command_as_root_with_hosts():
    spec = LaunchSpec(
        np=3,
        program=PROGRAM,
        hosts=[Host("a", 2), Host("b", 1)],
        env=KNOBS,
        forward=["PATH", "PYTHONPATH", "HVDLITE_CYCLE_TIME"],
    )
    assert mpiexec_command(OPENMPI, spec, as_root=True) == [
        "/opt/ompi/bin/mpirun",
        "-np",
        "3",
        "--allow-run-as-root",
        "-H",
        "a:2,b:1",
        "--bind-to",
        "none",
        "--tag-output",
        "-x",
        "PATH",
        "-x",
        "PYTHONPATH",
        "-x",
        "HVDLITE_CYCLE_TIME",
        "-x",
        "HVDLITE_TIMELINE",
        *PROGRAM,
    ]  # by name only


def test_openmpi_command_local_not_root():
    cmd = mpiexec_command(OPENMPI, LaunchSpec(np=5, program=PROGRAM), as_root=False)
    assert cmd == [
        "/opt/ompi/bin/mpirun",
        "-np",
        "5",
        "--oversubscribe",
        "--bind-to",
        "none",
        "--tag-output",
        *PROGRAM,
    ]
    assert "--allow-run-as-root" not in cmd


def test_intel_command_even_and_uneven_hosts():
    even = mpiexec_command(
        INTEL, LaunchSpec(np=4, program=["p"], hosts=[Host("a", 2), Host("b", 2)])
    )
    assert even == [
        "/opt/intel/bin/mpiexec",
        "-n",
        "4",
        "-hosts",
        "a,b",
        "-ppn",
        "2",
        "-prepend-rank",
        "-genv",
        "I_MPI_PIN",
        "0",
        "p",
    ]
    uneven = mpiexec_command(
        INTEL, LaunchSpec(np=3, program=["p"], hosts=[Host("a", 2), Host("b", 1)])
    )
    assert uneven == [
        "/opt/intel/bin/mpiexec",
        "-prepend-rank",
        "-genv",
        "I_MPI_PIN",
        "0",
        "-host",
        "a",
        "-n",
        "2",
        "p",
        ":",
        "-host",
        "b",
        "-n",
        "1",
        "p",
    ]


def test_srun_command():
    spec = LaunchSpec(np=4, program=PROGRAM)
    assert srun_command(spec, "pmi2") == [
        "srun",
        "--mpi=pmi2",
        "--ntasks=4",
        "--label",
        "--cpu-bind=none",
        "--kill-on-bad-exit=1",
        *PROGRAM,
    ]
    hosts = LaunchSpec(
        np=3,
        program=["p"],
        hosts=[Host("n1", 2), Host("n2", 1)],
        mpi_args=["--mpi=pmix_v4", "--exclusive"],
    )
    assert srun_command(hosts, "pmi2", srun="/usr/bin/srun") == [
        "/usr/bin/srun",
        "--ntasks=3",
        "--label",
        "--cpu-bind=none",
        "--kill-on-bad-exit=1",
        "--nodes=2",
        "--nodelist=n1,n2",
        "--mpi=pmix_v4",
        "--exclusive",
        "p",
    ]
    assert srun_mpi_plugin(OPENMPI) == "pmix"
    assert srun_mpi_plugin(MPICH) == "pmi2"
    assert srun_mpi_plugin(None) == "pmi2"


def test_forwarded_names():
    env = {
        "PATH": "/bin",
        "HOME": "/root",
        "PYTHONPATH": "/x",
        "HVDLITE_LOG_LEVEL": "INFO",
        "NCCL_DEBUG": "INFO",
        "SECRET_TOKEN": "no",
        "LD_LIBRARY_PATH": "/lib",
    }
    assert forwarded_names(env, exclude=["HVDLITE_LOG_LEVEL"]) == [
        "LD_LIBRARY_PATH",
        "NCCL_DEBUG",
        "PATH",
        "PYTHONPATH",
    ]


def _fake_launcher(path, version_text):
    path.write_text(f"#!/bin/sh\ncat <<'END'\n{version_text}\nEND\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


@pytest.mark.timeout(60)
def test_detect_runs_version(tmp_path):
    fake = _fake_launcher(tmp_path / "mpirun", "mpirun (Open MPI) 4.1.2")
    assert mpi.detect(str(fake)) == mpi.MpiInfo(str(fake), "openmpi", "4.1.2")
    odd = _fake_launcher(tmp_path / "odd", "I am not MPI")
    with pytest.raises(UsageError, match="not an MPI launcher"):
        mpi.detect(str(odd))


def test_find_mpiexec_order(tmp_path, monkeypatch):
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    on_path = _fake_launcher(fake_bin / "mpirun", "HYDRA")
    # Nothing beside the interpreter: PATH is searched, mpiexec before mpirun.
    monkeypatch.setattr(mpi.sys, "executable", str(tmp_path / "python"))
    assert mpi.find_mpiexec({"PATH": str(fake_bin)}) == str(on_path)
    assert mpi.find_mpiexec({"PATH": str(tmp_path / "empty")}) is None
    # Beside the interpreter wins over PATH.
    beside = _fake_launcher(tmp_path / "mpiexec", "HYDRA")
    assert mpi.find_mpiexec({"PATH": str(fake_bin)}) == str(beside)
    # The override wins over both, and must exist.
    assert mpi.find_mpiexec({"PATH": "", "HVDLITE_MPIEXEC": str(on_path)}) == str(on_path)
    with pytest.raises(UsageError, match="HVDLITE_MPIEXEC"):
        mpi.find_mpiexec({"PATH": "", "HVDLITE_MPIEXEC": str(tmp_path / "nope")})
    assert os.path.exists(beside)
