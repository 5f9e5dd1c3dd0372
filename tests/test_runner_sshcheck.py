"""hvdrun's ssh check of the other hosts, and the MPICH variables for jobs across hosts.

What hvdrun decides is checked through ``cli.prepare`` (nothing started); the check
itself runs the real ssh client against a port nothing listens on.  The same
paths against real hosts (network namespaces with sshd) are in test_multihost.py.
"""

from __future__ import annotations

import shutil
import sys

import pytest

from helpers_runner.common import cli_launch as _plan
from helpers_runner.common import genv as _genv

from hvdlite.runner import mpi, sshcheck

PY = sys.executable


def test_only_other_hosts_reached_through_ssh_are_checked():
    assert _plan(["-H", "n1:1,n2:1", PY]).ssh_hosts == ("n1", "n2")
    assert _plan(["-H", "localhost:1,n2:1", PY]).ssh_hosts == ("n2",)
    assert _plan(["-H", "localhost:2", PY]).ssh_hosts == ()
    assert _plan(["-np", "2", PY]).ssh_hosts == ()
    # Another launch agent chosen by the user: hvdrun does not second-guess it.
    assert _plan(["-H", "n1:1,n2:1", "--mpi-args=-launcher rsh", PY]).ssh_hosts == ()
    assert _plan(["-H", "n1:1,n2:1", PY], HYDRA_LAUNCHER="slurm").ssh_hosts == ()
    assert _plan(["-H", "n1:1,n2:1", PY], HYDRA_LAUNCHER="ssh").ssh_hosts == ("n1", "n2")


def test_inside_slurm_the_allocation_hosts_are_not_checked(tmp_path):
    slurm = {
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NODELIST": "n[1-2]",
        "SLURM_TASKS_PER_NODE": "2(x2)",
        "SLURM_NTASKS": "4",
    }
    plan = _plan([PY], **slurm)
    assert plan.hosts is not None and plan.ssh_hosts == ()
    key = tmp_path / "key"
    key.write_text("not a real key\n")
    # -p/-i make hvdrun ask MPICH for ssh, so then the hosts are checked.
    assert _plan(["-p", "2222", "-i", str(key), PY], **slurm).ssh_hosts == ("n1", "n2")
    assert _plan(["-p", "2222", "-i", str(key), PY], **slurm).ssh_args == (
        "-p",
        "2222",
        "-i",
        str(key),
    )


def test_mpich_with_ucx_and_ofi_runs_jobs_across_hosts_on_ofi():
    info = mpi.detect(mpi.find_mpiexec({"PATH": "/usr/bin:/bin"}))
    if info.flavour != "mpich" or not {"ucx", "ofi"} <= set(info.netmods):
        pytest.skip(f"needs an MPICH built with ucx and ofi (pip's mpich), not {info}")
    across = _plan(["-H", "n1:1,n2:1", PY])
    assert _genv(across)["MPIR_CVAR_CH4_NETMOD"] == "ofi"
    assert "MPIR_CVAR_CH4_NETMOD" not in _genv(_plan(["-np", "2", PY]))
    chosen = _plan(["-H", "n1:1,n2:1", PY], MPIR_CVAR_CH4_NETMOD="ucx")
    assert "MPIR_CVAR_CH4_NETMOD" not in _genv(chosen)  # the user's choice stays
    # libfabric's sockets provider, its first choice on plain Ethernet, now and then
    # never connects the ranks of different hosts: left out across hosts only.
    assert _genv(across)["FI_PROVIDER"] == "^sockets"
    assert "FI_PROVIDER" not in _genv(_plan(["-np", "2", PY]))
    mine = _plan(["-H", "n1:1,n2:1", PY], FI_PROVIDER="verbs")
    assert "FI_PROVIDER" not in _genv(mine)
    nics = _genv(_plan(["-H", "n1:1,n2:1", "--network-interface", "eth1,eth2", PY]))
    assert (nics["FI_TCP_IFACE"], nics["FI_SOCKETS_IFACE"], nics["UCX_NET_DEVICES"]) == (
        "eth1",
        "eth1",
        "eth1,eth2",
    )


@pytest.mark.parametrize(
    "text, netmods",
    [
        (
            "    Configure options:   --with-device=ch4:ucx,ofi --with-pm=hydra:gforker",
            ("ucx", "ofi"),
        ),
        ("    Configure options:   '--with-device=ch4:ofi' '--prefix=/opt'", ("ofi",)),
        ("    Configure options:   --with-device=ch3:nemesis", ()),
        ("HYDRA build details:\n    Version: 4.2.0", ()),
    ],
)
def test_parse_netmods(text, netmods):
    assert mpi.parse_netmods(text) == netmods


def test_check_command_mirrors_the_launch():
    assert sshcheck.check_command("n2", ["-p", "2222", "-i", "/k"]) == [
        "ssh",
        "-o",
        "BatchMode=yes",
        "-o",
        f"ConnectTimeout={sshcheck.CONNECT_TIMEOUT}",
        "-p",
        "2222",
        "-i",
        "/k",
        "n2",
        "true",
    ]


def test_a_refused_login_names_the_host_and_ssh_s_reason():
    if shutil.which("ssh") is None:
        pytest.skip("no ssh client installed")
    with pytest.raises(sshcheck.HostCheckError) as info:
        sshcheck.check_hosts(["127.0.0.1"], ["-p", "1"])  # nothing listens on port 1
    message = str(info.value)
    assert message.startswith("cannot log in with ssh to 1 of 1 other host(s)"), message
    assert "  127.0.0.1: ssh: connect to host 127.0.0.1 port 1: Connection refused" in message
    assert "-p 1 HOST true" in message


def test_no_ssh_client_is_a_clear_error():
    with pytest.raises(sshcheck.HostCheckError, match="ssh is not on PATH"):
        sshcheck.check_hosts(["n2"], environ={"PATH": "/nonexistent"})
    sshcheck.check_hosts([], environ={"PATH": "/nonexistent"})  # nothing to check
