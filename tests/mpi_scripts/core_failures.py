"""Failure paths that end, refuse or interrupt a job, one per MODE.

Usage: ``mpiexec -n N python core_failures.py MODE``.  Each mode prints lines
``rank R: ...`` that tests/test_core_failures.py checks, together with the
job's exit code and how long it took (lines start ``<rR>``, a tag that no
message contains).  Modes:

init refusals (every rank must raise the same error, then a correct init works):
  knob-mismatch      rank 1 runs with another HVDLITE_FUSION_THRESHOLD
  bad-knob           the last rank runs with HVDLITE_CYCLE_TIME=nan
  timeline-unopenable  rank 0 cannot create its timeline file
  sets-differ        rank 0 passes other process_sets than the rest
waits on a peer that is alive but not taking part (HVDLITE_COLLECTIVE_TIMEOUT=3):
  stopped-peer       the last rank stops itself (SIGSTOP); the others allreduce
  silent-peer        the last rank sleeps instead of submitting; the others allreduce
  shm-barrier        the last rank never enters a shared-memory allreduce
errors that must end the job or reach the caller:
  thread-raises      an exception in a non-main thread of the last rank
  interrupt-sigint   Ctrl-C (SIGINT) on rank 0 while it drives a cycle
  interrupt-exit     sys.exit(3) from a SIGTERM handler, same place
  interrupt-alone    (one rank) a KeyboardInterrupt raised inside a step
  fork               a child forked after init()
  timeline-full      rank 0's timeline is written to /dev/full
  memory             100,000 unnamed collectives; sizes and RSS before and after
"""

import os
import signal
import sys
import threading
import time

import numpy as np

RANK = int(os.environ.get("PMI_RANK", "0"))
SIZE = int(os.environ.get("PMI_SIZE", "1"))
LAST = SIZE - 1
mode = sys.argv[1]


def say(text):
    """One line of this rank's, tagged so the test can split interleaved output."""
    print(f"<r{RANK}> {text}", flush=True)


def refused_then_fine(bad_env, **init_kwargs):
    """init() with *bad_env* must fail here; then a correct init() must work."""
    import hvdlite as hvd

    saved = {k: os.environ.get(k) for k in bad_env}
    os.environ.update(bad_env)
    start = time.monotonic()
    try:
        hvd.init(**init_kwargs)
    except (ValueError, OSError) as exc:
        say(f"init refused with {type(exc).__name__} after {time.monotonic() - start:.1f}s: {exc}")
    else:
        say("init was NOT refused")
        return
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    assert not hvd.is_initialized()
    hvd.init()
    out = hvd.allreduce(np.ones(2), op=hvd.Sum, name="after.refusal")
    say(f"init after the refusal works: {out[0]:.0f}")


if mode == "knob-mismatch":
    refused_then_fine({"HVDLITE_FUSION_THRESHOLD": "1024"} if RANK == 1 else {})
    sys.exit(0)
if mode == "bad-knob":
    refused_then_fine({"HVDLITE_CYCLE_TIME": "nan"} if RANK == LAST else {})
    sys.exit(0)
if mode == "timeline-unopenable":
    refused_then_fine({"HVDLITE_TIMELINE": "/nonexistent-dir/timeline.json"})
    sys.exit(0)
if mode == "sets-differ":
    import hvdlite as hvd

    sets = [hvd.ProcessSet([0])] if RANK == 0 else [hvd.ProcessSet([LAST])]
    refused_then_fine({}, process_sets=sets)
    sys.exit(0)

if mode in ("stopped-peer", "silent-peer", "shm-barrier"):
    os.environ["HVDLITE_COLLECTIVE_TIMEOUT"] = "3"
if mode == "interrupt-alone":
    os.environ["HVDLITE_OVERLAP"] = "off"  # the waiting caller, not the thread, runs cycles
if mode == "timeline-full" and RANK == 0:
    os.environ["HVDLITE_TIMELINE"] = "/dev/full"

import hvdlite as hvd  # noqa: E402

hvd.init()
assert hvd.allreduce(np.ones(2), op=hvd.Sum, name="warmup")[0] == SIZE
say("warmed up")
start = time.monotonic()

if mode in ("stopped-peer", "silent-peer"):
    if RANK == LAST:
        time.sleep(0.3)
        if mode == "stopped-peer":
            os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(60)
        say("the silent rank woke up: the job was not ended")
    else:
        time.sleep(0.5)
        hvd.allreduce(np.ones(2), name="never.completes")
        say("the allreduce completed without the silent rank")

elif mode == "shm-barrier":
    from mpi4py import MPI

    from hvdlite.exceptions import CollectiveTimeoutError
    from hvdlite.device.buffers import Reduction
    from hvdlite.ops import ReduceOp
    from hvdlite.engine.transports.shm import SharedMemoryAllreduce
    from hvdlite.engine.wait_limit import WaitLimit

    comm = MPI.COMM_WORLD.Dup()
    shm = SharedMemoryAllreduce.create(comm, WaitLimit(3.0, RANK))
    assert shm is not None, "the ranks of this test share one node"
    if RANK == LAST:
        time.sleep(8)
    else:
        tensors = Reduction()
        data = np.ones(1 << 16, np.float32)
        tensors.add(None, data, np.empty_like(data), data.size, 1.0, 1.0)
        try:
            shm.allreduce(tensors, np.dtype(np.float32), ReduceOp.SUM)
            say("the shared-memory allreduce completed without the last rank")
        except CollectiveTimeoutError as exc:
            say(f"CollectiveTimeoutError after {time.monotonic() - start:.1f}s: {exc}")
        # mpiexec ends the job when the first rank exits: stay until every waiting
        # rank has timed out (each started its 3 s a little apart) and said so.
        time.sleep(max(0.0, start + 6.0 - time.monotonic()))
    sys.stdout.flush()
    os._exit(0)  # a barrier is still posted: skip MPI's collective clean-up

elif mode == "thread-raises":
    if RANK == LAST:

        def broken():
            raise RuntimeError(f"deliberate failure in a worker thread of rank {RANK}")

        threading.Thread(target=broken, name="worker").start()
        time.sleep(60)
        say("the job went on after the thread's exception")
    else:
        hvd.allreduce(np.ones(2), name="never.completes")

elif mode in ("interrupt-sigint", "interrupt-exit"):
    if RANK == LAST:
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(60)
    else:
        if mode == "interrupt-exit":
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))
        signal.signal(signal.SIGINT, signal.default_int_handler)  # also when run in background
        sent = signal.SIGINT if mode == "interrupt-sigint" else signal.SIGTERM
        # The last rank is stopped before this rank starts its cycle, so the signal
        # arrives while this thread is inside it (in the status exchange).
        time.sleep(1.0)
        threading.Timer(1.0, os.kill, (os.getpid(), sent)).start()
        try:
            hvd.allreduce(np.ones(2), name="waits.for.the.stopped.rank")
            say("the allreduce completed")
        except KeyboardInterrupt:
            say("KeyboardInterrupt reached the caller")
            try:
                hvd.allreduce(np.ones(2), name="after.interrupt")
            except hvd.HorovodInternalError as exc:
                say(f"the next collective fails: {exc}")
        finally:
            say("finally ran")

elif mode == "interrupt-alone":

    def interrupt(_handle):
        raise KeyboardInterrupt

    first = hvd.allreduce_async(np.ones(2), name="first")
    first.add_done_callback(interrupt)
    try:
        hvd.allreduce(np.ones(2), name="second")
        say("the interrupt was swallowed")
    except KeyboardInterrupt:
        say("KeyboardInterrupt reached the caller")
    except hvd.HorovodInternalError as exc:
        say(f"the interrupt became HorovodInternalError: {exc}")
    try:
        hvd.allreduce(np.ones(2), name="after.interrupt")
    except hvd.HorovodInternalError as exc:
        say(f"the next collective fails: {exc}")
    hvd.shutdown()
    hvd.init()
    say(f"restarted: {hvd.allreduce(np.ones(2), op=hvd.Sum, name='restarted')[0]:.0f}")

elif mode == "fork":
    pid = os.fork()
    if pid == 0:
        try:
            print(f"<r{RANK}> child: is_initialized={hvd.is_initialized()}", flush=True)
            for call in (lambda: hvd.allreduce(np.ones(2), name="from.child"), hvd.rank):
                try:
                    call()
                    print(f"<r{RANK}> child: a call worked", flush=True)
                except RuntimeError as exc:
                    print(f"<r{RANK}> child: refused: {exc}", flush=True)
            import hvdlite.basics

            hvdlite.basics._shutdown_at_exit()  # the exit hook must leave the parent's MPI alone
            print(f"<r{RANK}> child: exit hook done", flush=True)
        finally:
            os._exit(0)  # as multiprocessing's children do: MPI_Finalize belongs to the parent
    _, status = os.waitpid(pid, 0)
    say(f"child exit status {os.waitstatus_to_exitcode(status)}")
    out = hvd.allreduce(np.ones(2), op=hvd.Sum, name="after.fork")
    say(f"parent still works: {out[0]:.0f}")

elif mode == "timeline-full":
    for i in range(300):
        hvd.allreduce(np.ones(4), name=f"traced.{i}")
    say(f"300 collectives done, timeline on: {hvd.is_initialized()}")

elif mode == "memory":
    import resource

    from hvdlite.engine import runtime

    st = runtime.state()
    engine = st.engine

    def sizes():
        table = len(engine.coordinator._table) if engine.coordinator else 0
        rows = st.timeline.rows if st.timeline is not None else 0
        return (
            f"table={table} pending={len(engine.flight.pending)} cache={len(engine.bits.cache)} "
            f"pool={engine.executor.pool.nbytes()} timeline_rows={rows}"
        )

    def rss_mb():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    def run(rounds):
        for _ in range(rounds):
            handles = [hvd.allreduce_async(np.ones(8, np.float32)) for _ in range(100)]
            for h in handles:
                h.result()

    run(100)  # warm: every buffer and cache reached its working size
    say(f"after 10000: rss={rss_mb():.1f}MB {sizes()}")
    run(900)
    say(f"after 100000: rss={rss_mb():.1f}MB {sizes()}")

else:
    raise SystemExit(f"unknown mode {mode!r}")
