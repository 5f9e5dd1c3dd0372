"""The trace's vocabulary: phases, track ids, and the records the engine hands over.

A timeline is a Chrome trace (the JSON array format that ui.perfetto.dev and
chrome://tracing open) written by rank 0.  Each tensor name has a track.  Every
slice on it carries its phase in ``cat`` and, in ``name``, the activity name
Horovod's timeline gives it (the names users' scripts search a timeline for):

- ``negotiate`` (``NEGOTIATE_ALLREDUCE``, ``NEGOTIATE_ALLGATHER`` ...): from
  rank 0's submission (or the first rank's report, if earlier) until every rank
  was ready and the response was known;
- ``op`` (``ALLREDUCE``, ``BROADCAST`` ...): the tensor's execution, around the
  phases below; its args the batch id, the tensors in the batch, dtypes and shapes;
- ``queue`` (``QUEUE``): from the response until its batch started (batches of
  one cycle run one after the other);
- ``copy_in`` / ``copy_out`` (``MEMCPY_IN_FUSION_BUFFER`` /
  ``MEMCPY_OUT_FUSION_BUFFER``): packing into / unpacking from the fusion buffer;
- ``collective`` (``MPI_ALLREDUCE``, ``MPI_BCAST``, ``SHM_ALLREDUCE``,
  ``HIERARCHICAL_ALLREDUCE``, ``NCCL_ALLGATHER`` ...): the data movement, named
  by its path and kind; ``args.path`` says the path in words (``shared memory``,
  ``CUDA-aware MPI`` ...);
- ``callbacks`` (``CALLBACKS``, hvdlite's own): completing the handles
  (done-callbacks run here).

Execution slices carry ``args.batch``: the same id on every tensor fused into
one batch.  On the coordinator's tracks, instant events (``cat`` ``report``,
named by the rank, as Horovod names them) mark the cycle in which each rank
reported the tensor; the negotiate slice's args sum them up (``last``: the
ranks that reported last; ``wait_for_last_us``: from the first report to the
last; ``cached``: decided by the response cache, so no reports).  With
``mark_cycles`` each engine cycle starts with a global ``CYCLE_START`` instant
(Horovod's marker), and a track of its own shows the cycle as a slice
(``cycle N``), from its start to the last thing recorded in it.

A training step of a framework's distributed optimizer draws two slices of its
own on one more track (``training steps``), from rank 0's training thread:

- ``backward`` (``BACKWARD``): from the first gradient the optimizer's hooks saw
  in the step until ``synchronize()`` began (``step()`` calls it);
- ``synchronize`` (``SYNCHRONIZE``): ``synchronize()`` itself, which starts what
  backward did not and waits for every gradient's reduction.

Both carry ``args.step``, the optimizer's step counted from 1.  The collectives
that ran inside the backward slice were hidden behind computation; those after
it, the step waited for (``python -m hvdlite.timeline overlap``).
"""

from __future__ import annotations

__all__ = [
    "NEGOTIATE",
    "QUEUE",
    "COPY_IN",
    "COLLECTIVE",
    "COPY_OUT",
    "CALLBACKS",
    "PHASES",
    "EXECUTION",
    "OPERATION",
    "REPORT",
    "CYCLE",
    "CYCLE_START",
    "ACTIVITIES",
    "LABELS",
    "CYCLES_TRACK",
    "STEPS_TRACK",
    "FIRST_TENSOR_TRACK",
    "BACKWARD",
    "SYNCHRONIZE",
    "STEP_PHASES",
]

NEGOTIATE = "negotiate"
QUEUE = "queue"
COPY_IN = "copy_in"
COLLECTIVE = "collective"
COPY_OUT = "copy_out"
CALLBACKS = "callbacks"
#: Every phase, in the order a tensor goes through them.
PHASES = (NEGOTIATE, QUEUE, COPY_IN, COLLECTIVE, COPY_OUT, CALLBACKS)
#: The phases of a batch's execution (one slice per tensor, the batch's times).
EXECUTION = PHASES[1:]
OPERATION = "op"
REPORT = "report"
CYCLE = "cycle"
BACKWARD = "backward"
SYNCHRONIZE = "synchronize"
#: The phases of a training step, on the steps track (slice names: the phase in capitals).
STEP_PHASES = (BACKWARD, SYNCHRONIZE)

#: How each phase reads in a table or legend (a collective slice's own name says
#: its path and kind).
LABELS = {
    NEGOTIATE: "negotiate",
    QUEUE: "queue",
    COPY_IN: "copy in",
    COLLECTIVE: "collective",
    COPY_OUT: "copy out",
    CALLBACKS: "callbacks",
    BACKWARD: "backward",
    SYNCHRONIZE: "synchronize",
}

#: The slice names of the phases whose name does not depend on the kind or the path:
#: Horovod's activity names, and hvdlite's own for the callbacks and the step's phases.
ACTIVITIES = {
    QUEUE: "QUEUE",
    COPY_IN: "MEMCPY_IN_FUSION_BUFFER",
    COPY_OUT: "MEMCPY_OUT_FUSION_BUFFER",
    CALLBACKS: "CALLBACKS",
    BACKWARD: "BACKWARD",
    SYNCHRONIZE: "SYNCHRONIZE",
}
#: Horovod's name for the instant that marks the start of each engine cycle.
CYCLE_START = "CYCLE_START"

CYCLES_TRACK = 1
STEPS_TRACK = 2
FIRST_TENSOR_TRACK = 3

# Records: what the engine thread (and, R_SPAN, the training thread) appends: plain
# tuples, tagged by their first item.
R_CYCLE = 0  # (R_CYCLE, time, cycle number)
R_SUBMIT = 1  # (R_SUBMIT, [(key, submitted time, kind), ...])
R_REPORTS = 2  # (R_REPORTS, time, gathered): gathered[rank][0] is that rank's request list
R_DECIDED = 3  # (R_DECIDED, time): this cycle's responses are known
R_BATCH = 4  # (R_BATCH, batch, path, marks, finish time or None, end time)
R_SPAN = 5  # (R_SPAN, step phase, start, end, step): from the training thread
