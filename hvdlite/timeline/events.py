"""Turning the engine's records into trace lines: :class:`TraceBuilder`.

Pure logic (no threads, no files), fed one record at a time by the writer
thread, so it is unit-tested with hand-made records.  It keeps what spans
records: the tracks, the negotiations still open (a name a rank submitted or
reported and no response has run yet), the time the current cycle's responses
were known, and the batch counter.

Each event is one line ending in ``,\\n``, so a file cut anywhere is a JSON
array without its tail, which the reader (and Perfetto) accept.  The names in
the templates are constants; only track names (tensor names) go through
``json.dumps``.

Bounded over long runs: automatic names (``allreduce.noname.17``) share one
track per operation, past :data:`MAX_ROWS` tracks further names share one last
track, and a name that never completes (its negotiation failed) is forgotten
once :data:`MAX_OPEN` others are open.
"""

from __future__ import annotations

import json

from ..engine.messages import CACHEABLE, Kind
from ..ops import ReduceOp
from . import schema as s

__all__ = ["TraceBuilder", "MAX_ROWS", "MAX_OPEN", "collective_name"]

#: Tracks (one per tensor name) a timeline draws at most.
MAX_ROWS = 4096
#: Negotiations remembered at once (names submitted or reported, not yet run).
MAX_OPEN = 1 << 14
#: Names whose track id and description are kept at hand (a cache; recomputed when gone).
_KEYS_KEPT = 4096
_OVERFLOW_ROW = "(more names)"
_NONAME = ".noname"
_TRACED = frozenset(int(k) for k in CACHEABLE)
_KIND = {int(k): k.name for k in Kind}  # ALLREDUCE ...: Horovod's request and response names
_ADASUM = int(ReduceOp.ADASUM)
# How a path (a Transport's value) and a kind read in a collective slice's name, as in
# Horovod's activity names (MPI_ALLREDUCE, MPI_BCAST, NCCL_ALLGATHER ...).  Device buffers
# that go through MPI (CUDA-aware, or staged through host memory) are MPI_ activities there
# too; args.path tells them apart.
_PATH_PREFIX = {
    "mpi": "MPI",
    "shared memory": "SHM",
    "hierarchical": "HIERARCHICAL",
    "hierarchical, 16-bit floats across nodes": "HIERARCHICAL",
    "NCCL": "NCCL",
    "CUDA-aware MPI": "MPI",
    "staged through host memory": "MPI",
}
_COLLECTIVE_OF_KIND = {"BROADCAST": "BCAST", "ADASUM": "ADASUM_ALLREDUCE"}
_LAST_SHOWN = 16  # ranks listed in a negotiation's "last" at most

_TID = "\x00"  # stands for the track id in a batch's block of lines
_SLICE = (
    '{"ph":"X","cat":"%s","name":"%s","pid":0,"tid":\x00,"ts":%.3f,"dur":%.3f,'
    '"args":{"batch":%d}},\n'
)
_COLLECTIVE = (
    '{"ph":"X","cat":"%s","name":"%s","pid":0,"tid":\x00,"ts":%.3f,"dur":%.3f,'
    '"args":{"batch":%d,"path":%s}},\n'
)
_OP = (
    '{"ph":"X","cat":"op","name":"%s","pid":0,"tid":%d,"ts":%.3f,"dur":%.3f,'
    '"args":{"batch":%d,"fused":%d,%s}},\n'
)
_NEGOTIATE = (
    '{"ph":"X","cat":"negotiate","name":"NEGOTIATE_%s","pid":0,"tid":%d,'
    '"ts":%.3f,"dur":%.3f,"args":%s},\n'
)
_REPORT = (
    '{"ph":"i","s":"t","cat":"report","name":"%d","pid":0,"tid":%d,"ts":%.3f,"args":{"rank":%d}},\n'
)
_CYCLE = '{"ph":"X","cat":"cycle","name":"cycle %d","pid":0,"tid":%d,"ts":%.3f,"dur":%.3f},\n'
_CYCLE_START = (
    '{"ph":"i","s":"g","cat":"cycle","name":"%s","pid":0,"tid":%d,"ts":%.3f,"args":{"cycle":%d}},\n'
)
_SPAN = (
    '{"ph":"X","cat":"%s","name":"%s","pid":0,"tid":%d,"ts":%.3f,"dur":%.3f,"args":{"step":%d}},\n'
)
_STEPS_ROW = '"training steps"'
_REPORTED = '{"ranks":%d,"last":%s,"wait_for_last_us":%.3f}'
_DESCRIPTION = '"dtypes":%s,"shapes":%s'
_PROCESS = '{"ph":"M","name":"process_name","pid":0,"args":{"name":%s}},\n'
_END = '{"ph":"i","s":"g","name":"timeline end","pid":0,"tid":0,"ts":%.3f}\n]\n'
_TRACK = (
    '{"ph":"M","name":"thread_name","pid":0,"tid":%d,"args":{"name":%s}},\n'
    '{"ph":"M","name":"thread_sort_index","pid":0,"tid":%d,"args":{"sort_index":%d}},\n'
)


def collective_name(path: str, kind: str) -> str:
    """The collective slice's name: Horovod's activity name for *kind* (``ALLREDUCE``
    ...) moved on *path* (a Transport's value), e.g. ``MPI_ALLREDUCE``, ``MPI_BCAST``."""
    prefix = _PATH_PREFIX.get(path) or path.upper().replace(" ", "_").replace("-", "_")
    return f"{prefix}_{_COLLECTIVE_OF_KIND.get(kind, kind)}"


class _Negotiation:
    """One name from its first sighting on rank 0 until its response runs."""

    __slots__ = ("start", "local", "reported", "first", "last", "last_ranks")

    def __init__(self, start: float, local: bool):
        self.start = start
        self.local = local  # rank 0 submitted it
        self.reported = 0
        self.first = 0.0
        self.last = 0.0
        self.last_ranks: list[int] = []

    def report(self, rank: int, t: float) -> None:
        if not self.reported:
            self.first = t
        self.reported += 1
        if t > self.last or not self.last_ranks:
            self.last, self.last_ranks = t, [rank]
        elif t == self.last:
            self.last_ranks.append(rank)

    def args(self) -> str:
        if not self.reported:
            return '{"cached":true}'
        return _REPORTED % (
            self.reported,
            json.dumps(self.last_ranks[:_LAST_SHOWN]),
            (self.last - self.first) * 1e6,
        )


class TraceBuilder:
    """Trace lines from records (see :mod:`~hvdlite.timeline.schema` for both)."""

    def __init__(self, t0: float, mark_cycles: bool = False, process: str = "hvdlite rank 0"):
        self._t0 = t0
        self._mark_cycles = mark_cycles
        self._process = process
        self._tracks: dict[str, int] = {}
        self._tid_of_key: dict[tuple, int] = {}
        self._open: dict[tuple, _Negotiation] = {}
        self._decided = t0
        self._batches = 0
        self._cycle: tuple[int, float] | None = None  # (number, start) of the open cycle
        self._latest = t0  # the latest time recorded (where the open cycle ends)
        self._described: dict[tuple, tuple] = {}  # key -> (params, its "dtypes/shapes" args)
        self._steps_drawn = False  # the steps track's name is written

    @property
    def rows(self) -> int:
        return len(self._tracks)

    def _us(self, t: float) -> float:
        return (t - self._t0) * 1e6 if t > self._t0 else 0.0

    # ----------------------------------------------------------------- file ends
    def header(self) -> str:
        lines = ["[\n", _PROCESS % json.dumps(self._process)]
        if self._mark_cycles:
            lines.append(_TRACK % (s.CYCLES_TRACK, '"engine cycles"', s.CYCLES_TRACK, 0))
        return "".join(lines)

    def footer(self, t: float) -> str:
        """The open cycle and the closing event, without a trailing comma, and ``]``."""
        out: list[str] = []
        self._end_cycle(out)
        out.append(_END % self._us(t))
        return "".join(out)

    # ------------------------------------------------------------------ records
    def add(self, record: tuple, out: list[str]) -> None:
        """Append the lines of *record* to *out*."""
        tag = record[0]
        if tag == s.R_BATCH:
            self._batch(record, out)
        elif tag == s.R_DECIDED:
            self._decided = self._latest = record[1]
        elif tag == s.R_SUBMIT:
            self._submitted(record[1])
        elif tag == s.R_REPORTS:
            self._reports(record[1], record[2], out)
            self._latest = record[1]
        elif tag == s.R_SPAN:
            self._span(record, out)
        elif tag == s.R_CYCLE:
            self._end_cycle(out)
            self._cycle = (record[2], record[1])
            out.append(
                _CYCLE_START % (s.CYCLE_START, s.CYCLES_TRACK, self._us(record[1]), record[2])
            )

    def _end_cycle(self, out: list[str]) -> None:
        if self._cycle is not None:
            number, start = self._cycle
            out.append(
                _CYCLE
                % (number, s.CYCLES_TRACK, self._us(start), max(0.0, self._latest - start) * 1e6)
            )
            self._cycle = None

    def _span(self, record: tuple, out: list[str]) -> None:
        """A training step's phase, on the steps track (named the first time)."""
        _, phase, start, end, step = record
        if not self._steps_drawn:
            self._steps_drawn = True
            out.append(_TRACK % (s.STEPS_TRACK, _STEPS_ROW, s.STEPS_TRACK, s.STEPS_TRACK))
        out.append(
            _SPAN
            % (
                phase,
                s.ACTIVITIES[phase],
                s.STEPS_TRACK,
                self._us(start),
                max(0.0, end - max(start, self._t0)) * 1e6,
                step,
            )
        )

    def _submitted(self, items) -> None:
        opened = self._open
        for key, t, kind in items:
            if kind not in _TRACED:
                continue
            neg = opened.get(key)
            if neg is None or neg.local:  # new, or a stale one that never ran
                self._remember(key, _Negotiation(t, True))
            else:  # other ranks reported it first
                neg.local = True
                neg.start = min(neg.start, t)

    def _remember(self, key, neg: _Negotiation) -> None:
        opened = self._open
        opened.pop(key, None)
        if len(opened) >= MAX_OPEN:
            del opened[next(iter(opened))]
        opened[key] = neg

    def _reports(self, t: float, gathered, out: list[str]) -> None:
        opened = self._open
        at = self._us(t)
        for rank, item in enumerate(gathered):
            for p in item[0]:
                if p.kind not in _TRACED:
                    continue
                key = p.key
                neg = opened.get(key)
                if neg is None:
                    neg = _Negotiation(t, False)
                    self._remember(key, neg)
                neg.report(rank, t)
                out.append(_REPORT % (rank, self._tid(key, out), at, rank))

    def _batch(self, record: tuple, out: list[str]) -> None:
        _, batch, path, marks, finish, end = record
        self._latest = end
        decided = self._decided
        p0 = batch[0].params
        kind = _KIND.get(p0.kind, str(p0.kind))
        if p0.kind == Kind.ALLREDUCE and p0.op == _ADASUM:
            kind = "ADASUM"
        executed = len(marks) > 1 or finish is not None
        block = ""
        if executed:
            self._batches += 1
            block = self._phases(marks, finish, end, decided, path, kind, self._batches)
        fused = len(batch)
        at, took = self._us(decided), max(0.0, end - decided) * 1e6
        for response in batch:
            key = response.key
            tid = self._tid(key, out)
            neg = self._open.pop(key, None)
            if neg is not None:
                start = min(max(neg.start, self._t0), decided)
                out.append(
                    _NEGOTIATE % (kind, tid, self._us(start), (decided - start) * 1e6, neg.args())
                )
            if executed:
                out.append(
                    _OP
                    % (
                        kind,
                        tid,
                        at,
                        took,
                        self._batches,
                        fused,
                        self._describe(key, response.params),
                    )
                )
                out.append(block.replace(_TID, str(tid)))

    def _phases(self, marks, finish, end, decided, path, kind, batch_id) -> str:
        """The execution slices of one batch, with ``_TID`` for the track."""
        start = marks[0]
        points = marks[1:] or [(s.COLLECTIVE, start)]
        path = getattr(path, "value", path) or "mpi"
        path_words = json.dumps("MPI" if path == "mpi" else path)
        lines = [
            _SLICE
            % (
                s.QUEUE,
                s.ACTIVITIES[s.QUEUE],
                self._us(decided),
                max(0.0, start - decided) * 1e6,
                batch_id,
            )
        ]
        stop = finish if finish is not None else end
        for i, (phase, t) in enumerate(points):
            t = start if i == 0 else t
            until = points[i + 1][1] if i + 1 < len(points) else stop
            at, took = self._us(t), max(0.0, until - t) * 1e6
            if phase == s.COLLECTIVE:
                name = collective_name(path, kind)
                lines.append(_COLLECTIVE % (phase, name, at, took, batch_id, path_words))
            else:
                lines.append(_SLICE % (phase, s.ACTIVITIES[phase], at, took, batch_id))
        if finish is not None:
            lines.append(
                _SLICE
                % (
                    s.CALLBACKS,
                    s.ACTIVITIES[s.CALLBACKS],
                    self._us(finish),
                    max(0.0, end - finish) * 1e6,
                    batch_id,
                )
            )
        return "".join(lines)

    def _describe(self, key, params) -> str:
        known = self._described.get(key)
        if known is not None and known[0] == params:
            return known[1]
        text = _DESCRIPTION % (
            json.dumps(list(params.dtypes)),
            json.dumps([list(x) for x in params.shapes]),
        )
        if len(self._described) >= _KEYS_KEPT:
            self._described.clear()
        self._described[key] = (params, text)
        return text

    # ------------------------------------------------------------------- tracks
    def _tid(self, key, out: list[str]) -> int:
        tid = self._tid_of_key.get(key)
        if tid is not None:
            return tid
        set_id, name = key
        auto = name.find(_NONAME + ".")
        row = name if auto < 0 else name[: auto + len(_NONAME)]
        if set_id:
            row = f"{row} (process set {set_id})"
        tid = self._tracks.get(row)
        if tid is None:
            if len(self._tracks) >= MAX_ROWS - 1:
                row = _OVERFLOW_ROW
                tid = self._tracks.get(row)
            if tid is None:
                tid = self._tracks[row] = len(self._tracks) + s.FIRST_TENSOR_TRACK
                out.append(_TRACK % (tid, json.dumps(row), tid, tid))
        if len(self._tid_of_key) >= _KEYS_KEPT:
            self._tid_of_key.clear()
        self._tid_of_key[key] = tid
        return tid
