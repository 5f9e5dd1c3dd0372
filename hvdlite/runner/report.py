"""What hvdrun says when a job ends badly: the first failure, in a few lines.

A *failure* is a rank's exit status message (see :mod:`protocol`) with a
non-zero code.  When several ranks fail, the first is the earliest one that was
not told to stop by hvdrun (the others usually died because of it); its
rank, host, exit code or signal and last output lines are what the user needs.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence

__all__ = [
    "Failure",
    "first_failure",
    "format_failure",
    "format_launcher_failure",
    "exit_code_of",
    "rank_of_line",
    "split_rank",
]

_RULE = "=" * 72
_FALLBACK_LINES = 12
# The rank prefix each launcher puts on output lines: MPICH/Intel "[3] ",
# Open MPI "[1,3]<stderr>: ", srun --label "3: ".
_PREFIX = re.compile(r"^(?:\[(\d+)\] |\[\d+,(\d+)\]<std(?:out|err)>: ?|\s*(\d+): )")


def rank_of_line(line: str) -> int | None:
    """The rank a launcher-prefixed output line came from, or None."""
    return split_rank(line)[0]


def split_rank(line: str) -> tuple[int | None, str]:
    """``(rank, what the rank wrote)`` of a launcher-prefixed line; ``(None, line)``
    for a line without a rank prefix (the launcher's own)."""
    match = _PREFIX.match(line)
    if not match:
        return None, line
    rank = int(next(group for group in match.groups() if group is not None))
    return rank, line[match.end() :]


@dataclasses.dataclass(frozen=True)
class Failure:
    """One rank that ended with a non-zero status."""

    rank: int
    host: str
    code: int
    signal: int | None
    signame: str | None
    stopped: bool  # True when hvdrun (or the launcher) had asked it to stop
    time: float  # wall-clock time the rank's command ended
    tail: tuple[str, ...]
    frozen: float | None = None  # seconds it was stopped (SIGSTOP) when its wrapper killed it

    @classmethod
    def from_message(cls, message: dict) -> Failure:
        return cls(
            rank=int(message.get("rank", -1)),
            host=str(message.get("host", "?")),
            code=int(message.get("code") or 1),
            signal=message.get("signal"),
            signame=message.get("signame"),
            stopped=bool(message.get("stopped")),
            time=float(message.get("time") or 0.0),
            tail=tuple(str(line) for line in message.get("tail") or ()),
            frozen=message.get("frozen"),
        )

    @property
    def how(self) -> str:
        if self.frozen is not None:
            return (
                f"was stopped (SIGSTOP) for {int(self.frozen)} s and never continued: "
                "its task wrapper killed it (--frozen-timeout)"
            )
        if self.signal:
            name = f" ({self.signame})" if self.signame else ""
            return f"killed by signal {self.signal}{name}"
        return f"exited with code {self.code}"


def first_failure(failures: Iterable[Failure]) -> Failure | None:
    """The failure that started it: earliest unprompted one, else the earliest."""
    failures = list(failures)
    if not failures:
        return None
    unprompted = [f for f in failures if not f.stopped]
    return min(unprompted or failures, key=lambda f: (f.time, f.rank))


def exit_code_of(failure: Failure) -> int:
    """hvdrun's exit status for a job that failed this way (never 0)."""
    return failure.code if 0 < failure.code < 256 else 1


_NOTICE = (
    "(mpiexec's own notice of this failure, 'BAD TERMINATION OF ONE OF YOUR APPLICATION "
    "PROCESSES', is not shown: it says the same)"
)


def format_failure(
    failure: Failure, elapsed: float, nfailed: int, np: int, notices: int = 0
) -> str:
    """The report block for the first failure; *notices*: launcher notices of the
    failure that hvdrun left out of the output (it says so)."""
    lines = [
        _RULE,
        f"hvdrun: the job failed: rank {failure.rank} on host {failure.host} "
        f"{failure.how} ({elapsed:.1f} s after start)",
    ]
    if failure.tail:
        lines.append(f"last lines from rank {failure.rank}:")
        lines += [f"    {line}" for line in failure.tail]
    else:
        lines.append(f"rank {failure.rank} printed nothing")
    others = np - 1
    if others > 0:
        lines.append(
            f"the other {others} rank(s) were stopped by hvdrun"
            + (f" ({nfailed - 1} more reported a non-zero exit)" if nfailed > 1 else "")
        )
    if notices:
        lines.append(_NOTICE)
    lines.append(_RULE)
    return "\n".join(lines) + "\n"


def format_launcher_failure(
    launcher: str, returncode: int, tail: Sequence[tuple[str, str]], notices: int = 0
) -> str:
    """The report when the launcher failed and no rank reported a status.

    That happens when a rank calls MPI_Abort (the launcher kills every rank at
    once) or when the launcher itself fails.  *tail* holds ``(stream, line)``
    pairs; the rank that wrote last to stderr is named as the likely culprit.
    """
    how = (
        f"was killed by signal {-returncode}"
        if returncode < 0
        else f"exited with code {returncode}"
    )
    lines = [
        _RULE,
        f"hvdrun: the job failed: {launcher} {how} and no rank reported its exit "
        "(a rank called MPI_Abort, or the launcher failed)",
    ]
    suspect = next(
        (
            rank_of_line(text)
            for stream, text in reversed(tail)
            if stream == "stderr" and rank_of_line(text) is not None
        ),
        None,
    )
    shown = [text for _stream, text in tail]
    if suspect is not None:
        lines.append(f"the last error output came from rank {suspect}; its last lines:")
        shown = [text for text in shown if rank_of_line(text) == suspect]
    elif shown:
        lines.append("last lines of output:")
    lines += [f"    {line}" for line in shown[-_FALLBACK_LINES:]]
    if notices:
        lines.append(_NOTICE)
    lines.append(_RULE)
    return "\n".join(lines) + "\n"
