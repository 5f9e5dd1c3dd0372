"""SLURM allocation variables: node lists, tasks per node, and the hosts they give.

SLURM compresses host lists (``node[01-04,07],gpu-a[1-2]``) and repeated
counts (``2(x3),1``).  These helpers expand them without calling
``scontrol`` (which may not be on the compute nodes' PATH).  Only the
*allocation* comes from SLURM; rank and size come from MPI (inside a batch
script every ``mpiexec`` rank sees ``SLURM_PROCID=0``).

This module uses only the standard library: the task wrapper imports it
as a plain file on the compute nodes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

try:
    from .errors import UsageError
    from .hosts import Host
except ImportError:  # imported as a plain file (by the task wrapper)
    UsageError = ValueError  # type: ignore[misc,assignment]
    Host = None  # type: ignore[assignment,misc]

__all__ = [
    "in_allocation",
    "expand_nodelist",
    "expand_tasks_per_node",
    "allocation_hosts",
    "allocation_nodelist",
]

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
_COUNT = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def in_allocation(environ: Mapping[str, str]) -> bool:
    """True inside a SLURM job (batch script, ``salloc`` shell or ``srun`` step)."""
    return bool(environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID"))


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
            if depth > 1:
                raise UsageError(f"node list {text!r}: nested brackets")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise UsageError(f"node list {text!r}: ']' without '['")
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise UsageError(f"node list {text!r}: '[' without ']'")
    parts.append(text[start:])
    return parts


def _expand_range(body: str, text: str) -> list[str]:
    values = []
    for piece in body.split(","):
        match = _RANGE.match(piece.strip())
        if not match:
            raise UsageError(f"node list {text!r}: bad range {piece!r} inside brackets")
        low_text, high_text = match.group(1), match.group(2)
        width = len(low_text)
        low = int(low_text)
        high = int(high_text) if high_text is not None else low
        if high < low:
            raise UsageError(f"node list {text!r}: range {piece!r} goes backwards")
        values.extend(str(n).zfill(width) for n in range(low, high + 1))
    return values


def _expand_item(item: str, text: str) -> list[str]:
    names = [""]
    for literal, body in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", item):
        if not literal and body == "":
            continue
        suffixes = _expand_range(body, text) if body else [""]
        names = [name + literal + suffix for name in names for suffix in suffixes]
    return names


def expand_nodelist(text: str) -> list[str]:
    """``"node[01-03,07],login1"`` -> ``["node01", "node02", "node03", "node07", "login1"]``.

    Zero padding follows the low bound of each range; several bracket groups
    in one name expand as a product, left to right (``a[1-2]b[1-2]`` ->
    ``a1b1, a1b2, a2b1, a2b2``), as SLURM does.
    """
    text = text.strip()
    if not text:
        raise UsageError("node list is empty")
    names: list[str] = []
    for item in _split_top_level(text):
        item = item.strip()
        if not item:
            raise UsageError(f"node list {text!r}: empty entry")
        names.extend(_expand_item(item, text))
    return names


def expand_tasks_per_node(text: str) -> list[int]:
    """``"2(x3),1"`` -> ``[2, 2, 2, 1]`` (the ``SLURM_TASKS_PER_NODE`` syntax)."""
    counts: list[int] = []
    for piece in text.strip().split(","):
        match = _COUNT.match(piece.strip())
        if not match:
            raise UsageError(f"tasks per node {text!r}: bad entry {piece!r}")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def allocation_nodelist(environ: Mapping[str, str]) -> list[str]:
    """The expanded node names of the allocation (empty outside SLURM)."""
    raw = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST") or ""
    return expand_nodelist(raw) if raw.strip() else []


def allocation_hosts(environ: Mapping[str, str]) -> list:
    """Hosts and slots of the current allocation, as ``list[Host]``.

    Slots come from ``SLURM_TASKS_PER_NODE`` (one rank per task).  Raises
    UsageError when the variables are missing or disagree in length.
    """
    nodes = allocation_nodelist(environ)
    if not nodes:
        raise UsageError(
            "inside a SLURM job but SLURM_JOB_NODELIST is not set: pass -np and -H explicitly"
        )
    raw_tasks = environ.get("SLURM_TASKS_PER_NODE") or environ.get("SLURM_STEP_TASKS_PER_NODE")
    if not raw_tasks:
        raise UsageError(
            "inside a SLURM job but SLURM_TASKS_PER_NODE is not set "
            "(request tasks with #SBATCH --ntasks or --ntasks-per-node, or pass -np and -H)"
        )
    tasks = expand_tasks_per_node(raw_tasks)
    if len(tasks) != len(nodes):
        raise UsageError(
            f"SLURM_JOB_NODELIST has {len(nodes)} nodes but SLURM_TASKS_PER_NODE "
            f"{raw_tasks!r} gives {len(tasks)} counts"
        )
    return [Host(node, count) for node, count in zip(nodes, tasks, strict=True) if count > 0]
