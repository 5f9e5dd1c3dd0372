"""Pretend machines for multi-host tests: Linux network namespaces, each with its own sshd.

``NetnsHosts(workdir, ("h1", "h2")).start()`` builds, for every name:

- a network namespace ``hvdt-<pid>-<name>`` with two interfaces, ``mgmt0``
  (10.231.0.N/24; the host names resolve to these addresses) and ``data0``
  (10.231.1.N/24, a second network for ``--network-interface`` tests), each a
  veth whose other end sits on a bridge in a private "switch" namespace: no
  address, route or interface of the test is visible outside its namespaces;
- a host name: every process started "on" a host runs in a new UTS namespace
  whose hostname is that name (``unshare --uts``), so ``gethostname()`` tells
  the hosts apart;
- ``/etc/netns/<namespace>/hosts`` and ``/etc/netns/<namespace>/ssh/`` (which
  ``ip netns exec`` mounts over ``/etc/hosts`` and ``/etc/ssh`` inside the
  namespace): the names of all hosts, and an ssh client configuration that logs
  in as root with a key generated here, without host-key prompts;
- an sshd (Debian's openssh-server) listening on port 22 for that key and on
  port ``ALT_PORT`` for a second key only (``Match LocalPort``), which is what
  ``hvdrun -p ALT_PORT -i ALT_KEY`` needs and plain ssh does not have.

The namespaces share the file system, so the same Python, venv and repository
paths work on every host, as on a cluster with a shared file system.

``stop()`` kills every process left in the namespaces (sshd, its sessions,
ranks), deletes the namespaces (which deletes their interfaces) and the
``/etc/netns`` entries.  ``remove_stale()`` does the same for namespaces a
killed test run of an earlier process left behind.  ``reason_unavailable()``
says why the hosts cannot be built here (not root, no ``ip``, namespaces not
allowed, openssh-server not installable), or None.

The session fixture :func:`netns_hosts` builds ``h1``, ``h2`` and ``h3`` once per
test session (a test module imports it), plus the name ``down``, which resolves
to an address no host has; it skips, with the reason, where the hosts cannot be
built, and takes everything down at the end, also after failures.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

__all__ = [
    "NetnsHosts",
    "VirtualHost",
    "reason_unavailable",
    "remove_stale",
    "netns_hosts",
    "ALT_PORT",
    "MGMT_IFACE",
    "DATA_IFACE",
    "DOWN_HOST",
]

PREFIX = "hvdt-"
MGMT_IFACE, DATA_IFACE = "mgmt0", "data0"
_NETWORKS = ((MGMT_IFACE, "10.231.0"), (DATA_IFACE, "10.231.1"))
ALT_PORT = 2222
DOWN_HOST, _DOWN_ADDRESS = "down", "10.231.0.99"  # a name whose address nobody has
_SSHD = "/usr/sbin/sshd"
_STEP_TIMEOUT = 30


def _run(
    cmd: list[str], timeout: float = _STEP_TIMEOUT, check: bool = True
) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode:
        raise RuntimeError(
            f"{' '.join(cmd)} failed ({proc.returncode}): "
            f"{proc.stderr.strip() or proc.stdout.strip()}"
        )
    return proc


def _install_sshd() -> str | None:
    if os.path.exists(_SSHD) and shutil.which("ssh") and shutil.which("ssh-keygen"):
        return None
    if shutil.which("apt-get") is None:
        return "openssh-server is not installed and apt-get is not available"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = [
        "apt-get",
        "install",
        "-y",
        "-q",
        "--no-install-recommends",
        "openssh-server",
        "openssh-client",
    ]
    last = ""
    for attempt in range(2):
        if attempt:
            subprocess.run(
                ["apt-get", "update", "-q"], env=env, capture_output=True, timeout=300, check=False
            )
        try:
            proc = subprocess.run(
                cmd, env=env, capture_output=True, text=True, timeout=300, check=False
            )
        except subprocess.TimeoutExpired:
            return "apt-get install openssh-server timed out"
        if proc.returncode == 0 and os.path.exists(_SSHD):
            return None
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return f"apt-get install openssh-server failed: {last}"


def reason_unavailable() -> str | None:
    """Why network-namespace hosts cannot be built on this machine, or None."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network namespaces and sshd need root"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool!r} is not installed (iproute2 / util-linux)"
    probe = f"{PREFIX}probe-{os.getpid()}"
    try:
        made = _run(["ip", "netns", "add", probe], check=False)
        if made.returncode:
            return f"cannot create a network namespace: {made.stderr.strip()}"
        veth = _run(
            ["ip", "-n", probe, "link", "add", "a0", "type", "veth", "peer", "name", "b0"],
            check=False,
        )
        if veth.returncode:
            return f"cannot create a veth pair: {veth.stderr.strip()}"
        uts = _run(["ip", "netns", "exec", probe, "unshare", "--uts", "hostname", "x"], check=False)
        if uts.returncode:
            return f"cannot create a UTS namespace: {uts.stderr.strip()}"
    finally:
        _run(["ip", "netns", "del", probe], check=False)
    return _install_sshd()


def _namespace_pids(namespace: str) -> list[int]:
    proc = _run(["ip", "netns", "pids", namespace], check=False)
    return [int(word) for word in proc.stdout.split() if word.isdigit()]


def _delete_namespace(namespace: str) -> None:
    """Kill whatever runs in *namespace*, delete it and its /etc/netns entry."""
    for _attempt in range(20):
        pids = [pid for pid in _namespace_pids(namespace) if pid != os.getpid()]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.1)
    _run(["ip", "netns", "del", namespace], check=False)
    shutil.rmtree(Path("/etc/netns") / namespace, ignore_errors=True)


def _owner_alive(namespace: str) -> bool:
    pid = namespace[len(PREFIX) :].split("-", 1)[0]
    if not pid.isdigit():
        return False
    return Path(f"/proc/{pid}").exists()


def remove_stale() -> None:
    """Delete namespaces (and /etc/netns entries) whose creating process is gone."""
    names = set()
    for base in (Path("/run/netns"), Path("/etc/netns")):
        if base.is_dir():
            names |= {p.name for p in base.iterdir() if p.name.startswith(PREFIX)}
    for namespace in sorted(names):
        if not _owner_alive(namespace):
            _delete_namespace(namespace)


@dataclasses.dataclass(frozen=True)
class VirtualHost:
    """One pretend machine: its host name, namespace and addresses."""

    name: str
    namespace: str
    address: str  # on MGMT_IFACE; what the host name resolves to
    data_address: str  # on DATA_IFACE

    def wrap(self, argv: list[str], cgroups: bool = False) -> list[str]:
        """*argv* as a command that runs on this host (its namespace and host name).

        ``ip netns exec`` mounts a fresh /sys for the namespace, which hides the
        cgroup file systems; *cgroups* mounts them again (slurmd needs them).
        """
        setup = _cgroup_mounts() + " && " if cgroups else ""
        return [
            "ip",
            "netns",
            "exec",
            self.namespace,
            "unshare",
            "--uts",
            "--",
            "sh",
            "-c",
            setup + 'hostname "$0" && exec "$@"',
            self.name,
            *argv,
        ]


def _cgroup_mounts() -> str:
    """Shell commands that mount this machine's cgroup file systems as they are mounted here."""
    commands = []
    with open("/proc/self/mounts", encoding="utf-8") as mounts:
        for line in mounts:
            source, target, fstype, options = line.split()[:4]
            if target == "/sys/fs/cgroup" or target.startswith("/sys/fs/cgroup/"):
                commands.append(
                    f"mkdir -p {shlex.quote(target)} && mount -t {fstype} -o "
                    f"{shlex.quote(options)} {shlex.quote(source)} "
                    f"{shlex.quote(target)}"
                )
    return " && ".join(commands) or "true"


class NetnsHosts:
    """See the module docstring."""

    def __init__(self, workdir: Path, names: tuple[str, ...] = ("h1", "h2")) -> None:
        self.workdir = Path(workdir)
        self.switch = f"{PREFIX}{os.getpid()}-sw"
        self.hosts = {
            name: VirtualHost(
                name, f"{PREFIX}{os.getpid()}-{name}", f"10.231.0.{i}", f"10.231.1.{i}"
            )
            for i, name in enumerate(names, start=1)
        }
        self.client_key = self.workdir / "client_key"  # in every host's ssh client config
        self.alt_key = self.workdir / "alt_key"  # accepted on ALT_PORT only
        self.sshd: dict[str, subprocess.Popen] = {}
        self.namespaces: list[str] = []

    def __getitem__(self, name: str) -> VirtualHost:
        return self.hosts[name]

    # -- setup ---------------------------------------------------------------
    def _keys(self) -> None:
        for path in (self.client_key, self.alt_key, self.workdir / "host_key"):
            _run(
                [
                    "ssh-keygen",
                    "-q",
                    "-t",
                    "ed25519",
                    "-N",
                    "",
                    "-C",
                    "hvdlite-test",
                    "-f",
                    str(path),
                ]
            )
        (self.workdir / "authorized_keys").write_text(Path(f"{self.client_key}.pub").read_text())
        (self.workdir / "authorized_keys_alt").write_text(Path(f"{self.alt_key}.pub").read_text())

    def _network(self) -> None:
        _run(["ip", "netns", "add", self.switch])
        self.namespaces.append(self.switch)
        for bridge, _net in enumerate(_NETWORKS):
            _run(["ip", "-n", self.switch, "link", "add", f"br{bridge}", "type", "bridge"])
            _run(["ip", "-n", self.switch, "link", "set", f"br{bridge}", "up"])
        for index, host in enumerate(self.hosts.values(), start=1):
            _run(["ip", "netns", "add", host.namespace])
            self.namespaces.append(host.namespace)
            _run(["ip", "-n", host.namespace, "link", "set", "lo", "up"])
            for bridge, (iface, net) in enumerate(_NETWORKS):
                port = f"p{index}n{bridge}"
                _run(
                    [
                        "ip",
                        "-n",
                        host.namespace,
                        "link",
                        "add",
                        iface,
                        "type",
                        "veth",
                        "peer",
                        "name",
                        port,
                        "netns",
                        self.switch,
                    ]
                )
                _run(["ip", "-n", host.namespace, "addr", "add", f"{net}.{index}/24", "dev", iface])
                _run(["ip", "-n", host.namespace, "link", "set", iface, "up"])
                _run(["ip", "-n", self.switch, "link", "set", port, "master", f"br{bridge}"])
                _run(["ip", "-n", self.switch, "link", "set", port, "up"])

    def _etc(self) -> None:
        hosts_file = ["127.0.0.1 localhost", "::1 localhost"]
        hosts_file += [f"{h.address} {h.name}" for h in self.hosts.values()]
        hosts_file.append(f"{_DOWN_ADDRESS} {DOWN_HOST}")
        ssh_config = "\n".join(
            [
                "Host *",
                "    User root",
                f"    IdentityFile {self.client_key}",
                "    IdentitiesOnly yes",
                "    StrictHostKeyChecking no",
                "    UserKnownHostsFile /dev/null",
                "    BatchMode yes",
                "    ConnectTimeout 10",
                "    LogLevel ERROR",
                "",
            ]
        )
        for host in self.hosts.values():
            etc = Path("/etc/netns") / host.namespace
            (etc / "ssh").mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text("\n".join(hosts_file) + "\n")
            (etc / "ssh" / "ssh_config").write_text(ssh_config)

    def _sshd_config(self, host: VirtualHost) -> Path:
        d = self.workdir
        conf = d / f"sshd_{host.name}.conf"
        conf.write_text(
            "\n".join(
                [
                    "Port 22",
                    f"Port {ALT_PORT}",
                    f"HostKey {d / 'host_key'}",
                    f"PidFile {d / f'sshd_{host.name}.pid'}",
                    "PermitRootLogin prohibit-password",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "StrictModes no",
                    f"AuthorizedKeysFile {d / 'authorized_keys'}",
                    "UseDNS no",
                    "PrintMotd no",
                    "PrintLastLog no",
                    "X11Forwarding no",
                    "MaxStartups 100:30:200",
                    "MaxSessions 100",
                    "LogLevel VERBOSE",
                    f"Match LocalPort {ALT_PORT}",
                    f"    AuthorizedKeysFile {d / 'authorized_keys_alt'}",
                    "",
                ]
            )
        )
        return conf

    def _start_sshd(self) -> None:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation dir
        for host in self.hosts.values():
            conf = self._sshd_config(host)
            log = open(self.workdir / f"sshd_{host.name}.log", "wb")  # noqa: SIM115
            self.sshd[host.name] = subprocess.Popen(
                host.wrap([_SSHD, "-D", "-e", "-f", str(conf)]),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _wait_ready(self, seconds: float = 20) -> None:
        first = next(iter(self.hosts.values()))
        deadline = time.monotonic() + seconds
        for host in self.hosts.values():
            while True:
                proc = subprocess.run(
                    first.wrap(["ssh", host.name, "hostname"]),
                    capture_output=True,
                    text=True,
                    timeout=20,
                    check=False,
                )
                if proc.returncode == 0 and proc.stdout.strip() == host.name:
                    break
                dead = [n for n, p in self.sshd.items() if p.poll() is not None]
                if dead or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"sshd on {host.name} does not answer "
                        f"(exited: {dead or 'none'}): {proc.stderr.strip()}\n" + self.logs()
                    )
                time.sleep(0.2)

    def start(self) -> NetnsHosts:
        """Build the hosts; on any failure, undo what was built and raise."""
        remove_stale()
        try:
            self._keys()
            self._network()
            self._etc()
            self._start_sshd()
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    # -- use -----------------------------------------------------------------
    def wrap(self, name: str, argv: list[str], cgroups: bool = False) -> list[str]:
        return self.hosts[name].wrap(argv, cgroups)

    def pids(self, name: str) -> list[int]:
        """Processes running in host *name*'s namespace."""
        return _namespace_pids(self.hosts[name].namespace)

    def rx_bytes(self, name: str, iface: str) -> int:
        """Bytes host *name* received on *iface* so far."""
        proc = _run(
            [
                "ip",
                "netns",
                "exec",
                self.hosts[name].namespace,
                "cat",
                f"/sys/class/net/{iface}/statistics/rx_bytes",
            ]
        )
        return int(proc.stdout.strip())

    def logs(self) -> str:
        out = []
        for path in sorted(self.workdir.glob("sshd_*.log")):
            lines = path.read_text(errors="replace").strip().splitlines()[-10:]
            out.append(f"--- {path.name}\n" + "\n".join(lines))
        return "\n".join(out)

    # -- teardown ------------------------------------------------------------
    def stop(self) -> None:
        """Stop sshd, kill what is left in the namespaces, delete them; safe to repeat."""
        for proc in self.sshd.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.sshd.values():
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        for namespace in reversed(self.namespaces):
            _delete_namespace(namespace)
        for host in self.hosts.values():
            shutil.rmtree(Path("/etc/netns") / host.namespace, ignore_errors=True)
        self.namespaces.clear()


@pytest.fixture(scope="session")
def netns_hosts(tmp_path_factory):
    """Hosts h1, h2, h3 (see the module docstring); skips where they cannot be built."""
    reason = reason_unavailable()
    if reason:
        pytest.skip(f"no network-namespace hosts: {reason}")
    hosts = NetnsHosts(tmp_path_factory.mktemp("netns"), ("h1", "h2", "h3"))
    try:
        hosts.start()
        yield hosts
    finally:
        hosts.stop()
