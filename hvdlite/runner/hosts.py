"""Host lists: ``-H host:slots,...``, hostfiles, and what counts as "this machine".

A host list is an ordered list of :class:`Host` (name, slots).  Ranks are
placed in order: the first ``slots`` ranks on the first host, and so on, which
is what every MPI launcher does with such a list.  Parsing never touches the
network; a malformed list raises :class:`~hvdlite.runner.errors.UsageError`
with a message naming the bad entry.
"""

from __future__ import annotations

import dataclasses
import re
import socket
from collections.abc import Iterable

from .errors import UsageError

__all__ = [
    "Host",
    "parse_hosts",
    "parse_hostfile",
    "read_hostfile",
    "total_slots",
    "format_hosts",
    "is_local_host",
    "all_local",
    "used_hosts",
    "rank_hosts",
]

# RFC 1123 host names (letters, digits, '-', '.', and '_' which clusters use),
# or an IPv4 address; IPv6 literals are not accepted in the host:slots syntax.
_NAME = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9._-]*[A-Za-z0-9_])?$")


@dataclasses.dataclass(frozen=True)
class Host:
    """One machine of a job and how many ranks it may run."""

    name: str
    slots: int

    def __str__(self) -> str:
        return f"{self.name}:{self.slots}"


def _check_name(name: str, where: str) -> str:
    if not _NAME.match(name):
        raise UsageError(f"{where}: {name!r} is not a valid host name")
    return name


def _check_slots(text: str, name: str, where: str) -> int:
    try:
        slots = int(text)
    except ValueError:
        raise UsageError(
            f"{where}: slots for host {name!r} must be a positive integer, not {text!r}"
        ) from None
    if slots < 1:
        raise UsageError(f"{where}: slots for host {name!r} must be at least 1, not {slots}")
    return slots


def _no_duplicates(hosts: Iterable[Host], where: str) -> list[Host]:
    seen: set[str] = set()
    out = []
    for host in hosts:
        if host.name in seen:
            raise UsageError(f"{where}: host {host.name!r} is listed more than once")
        seen.add(host.name)
        out.append(host)
    return out


def parse_hosts(text: str) -> list[Host]:
    """Parse ``"a:2,b:4,c"`` (a host without ``:slots`` has one slot)."""
    where = f"-H {text!r}"
    entries = [part.strip() for part in text.split(",")]
    if not text.strip() or any(not part for part in entries):
        raise UsageError(f"{where}: expected host:slots[,host:slots...], e.g. -H node1:2,node2:2")
    hosts = []
    for part in entries:
        name, sep, slots = part.partition(":")
        name = _check_name(name.strip(), where)
        hosts.append(Host(name, _check_slots(slots.strip(), name, where) if sep else 1))
    return _no_duplicates(hosts, where)


def parse_hostfile(text: str, source: str = "hostfile") -> list[Host]:
    """Parse hostfile text: one host a line as ``host slots=N`` (or ``host:N``, or ``host``).

    ``#`` starts a comment; blank lines are ignored; ``max_slots=`` is accepted
    and ignored (Open MPI hostfiles carry it).
    """
    hosts = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source} line {lineno}"
        fields = line.split()
        name, sep, inline_slots = fields[0].partition(":")
        name = _check_name(name, where)
        slots = _check_slots(inline_slots, name, where) if sep else None
        for field in fields[1:]:
            key, eq, value = field.partition("=")
            if key == "slots" and eq and slots is None:
                slots = _check_slots(value, name, where)
            elif key == "max_slots" and eq:
                continue
            else:
                raise UsageError(f"{where}: expected 'host slots=N', got {line!r}")
        hosts.append(Host(name, 1 if slots is None else slots))
    if not hosts:
        raise UsageError(f"{source}: no hosts in it (expected lines like 'node1 slots=2')")
    return _no_duplicates(hosts, source)


def read_hostfile(path: str) -> list[Host]:
    """Read and parse the hostfile at *path*."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise UsageError(f"--hostfile {path!r}: cannot read it ({exc.strerror})") from None
    return parse_hostfile(text, source=f"hostfile {path!r}")


def total_slots(hosts: Iterable[Host]) -> int:
    return sum(host.slots for host in hosts)


def format_hosts(hosts: Iterable[Host]) -> str:
    """The ``host:slots,...`` spelling (what ``-H`` takes and MPI launchers accept)."""
    return ",".join(str(host) for host in hosts)


def _local_names() -> set[str]:
    names = {"localhost", "127.0.0.1", "::1"}
    try:
        hostname = socket.gethostname()
    except OSError:  # pragma: no cover - gethostname does not fail on Linux
        return names
    names.add(hostname)
    names.add(hostname.split(".", 1)[0])
    return names


def is_local_host(name: str) -> bool:
    """True when *name* is this machine (by name; no DNS lookups)."""
    return name in _local_names() or name.split(".", 1)[0] in _local_names()


def all_local(hosts: Iterable[Host]) -> bool:
    """True when the list is a single host and it is this machine."""
    hosts = list(hosts)
    return len(hosts) == 1 and is_local_host(hosts[0].name)


def used_hosts(hosts: Iterable[Host], np: int) -> list[Host]:
    """The hosts *np* ranks fill in order, the last one cut to the ranks it gets."""
    out, left = [], np
    for host in hosts:
        if left <= 0:
            break
        out.append(Host(host.name, min(host.slots, left)))
        left -= host.slots
    return out


def rank_hosts(hosts: Iterable[Host], np: int | None = None) -> dict[int, str]:
    """rank -> host name when ranks fill *hosts* in order, each host up to its slots
    (how MPICH's ``-hosts``, Open MPI's ``-H``, Intel MPI's ``-ppn`` and srun place
    them by default); *np* None places one rank per slot."""
    names, rank = {}, 0
    for host in hosts:
        for _ in range(host.slots):
            if np is not None and rank >= np:
                return names
            names[rank] = host.name
            rank += 1
    return names
