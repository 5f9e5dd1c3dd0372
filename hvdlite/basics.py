"""init/shutdown and what a process knows about the job: ranks, nodes, capabilities.

Cross-rank contract: ``init()`` is collective over the job's communicator
(every rank calls it, with the same ``process_sets``); ``shutdown()`` on any
rank stops the engine on every rank at its next cycle, and pending collectives
there fail with HorovodInternalError.  Rank queries are local.
"""

from __future__ import annotations

import atexit
import collections
import logging
import os
import sys
import threading

from . import config as _config
from . import start_report
from .engine import runtime
from .device.selection import agree as agree_device_choice
from .device.capabilities import cuda_available, nccl_version
from .engine import initial_sets
from .engine.init_agreement import Preparation, agree
from .engine.process_set_table import ProcessSetTable
from .process_sets import ProcessSet, global_process_set
from .engine.runtime import Runtime, is_running, live, state
from .engine.thread_affinity import core_for
from .timeline import Timeline
from .engine.runtime import routes_of
from .engine.transports.routes import Router, Transport

#: Horovod's basics; every framework module re-exports them (through :mod:`hvdlite.common`).
__all__ = [
    "init",
    "shutdown",
    "is_initialized",
    "size",
    "rank",
    "local_size",
    "local_rank",
    "cross_size",
    "cross_rank",
    "is_homogeneous",
    "mpi_threads_supported",
    "mpi_enabled",
    "mpi_built",
    "gloo_enabled",
    "gloo_built",
    "nccl_built",
    "cuda_built",
    "rocm_built",
    "ddl_built",
    "ccl_built",
    "start_timeline",
    "stop_timeline",
]

log = logging.getLogger("hvdlite")
_LEVELS = {
    "TRACE": 5,
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARNING": logging.WARNING,
    "ERROR": logging.ERROR,
    "FATAL": logging.CRITICAL,
}


_init_lock = threading.Lock()
_atexit_registered = False
_said_standing_in = False


def _configure_logging(level: str, rank: int, hide_time: bool) -> None:
    log.setLevel(_LEVELS[level])
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        when = "" if hide_time else "%(asctime)s "
        handler.setFormatter(
            logging.Formatter(f"[hvdlite rank {rank}] {when}%(levelname)s %(message)s")
        )
        log.addHandler(handler)
        log.propagate = False


def prepare_mpi_import(cfg=None) -> None:
    """Set mpi4py's init options from the knobs, unless MPI is already initialized.

    Importing ``mpi4py.MPI`` initializes MPI, so this runs before any hvdlite
    module that imports it (``init()``, or the first use of a collective).
    """
    if "mpi4py.MPI" in sys.modules:
        return
    if cfg is None:
        try:
            cfg = _config.read_config()
        except ValueError:
            cfg = _config.Config()  # init() reports the bad value
    import mpi4py

    mpi4py.rc.thread_level = "serialized" if cfg.mpi_threads_disable else "multiple"
    if cfg.mpi_threads_disable:
        # MPICH picks a much slower shared-memory allreduce below THREAD_MULTIPLE.
        os.environ.setdefault("MPIR_CVAR_ALLREDUCE_POSIX_INTRA_ALGORITHM", "mpir")


def _import_mpi(cfg):
    """Import mpi4py's MPI, asking for the thread level the knobs select.

    MPI that the program initialized itself is used as it is.  A program that
    told mpi4py not to initialize MPI (``mpi4py.rc.initialize = False``) and
    did not do it either gets MPI initialized here, as Horovod does, and
    finalized at exit after hvdlite has shut down.
    """
    loaded = sys.modules.get("mpi4py.MPI")
    if loaded is None or not loaded.Is_initialized():
        start_report.begin()  # hvdrun's --start-timeout now watches for ready()
    try:
        prepare_mpi_import(cfg)
        from mpi4py import MPI
    except (ImportError, RuntimeError) as exc:
        raise RuntimeError(
            "hvdlite could not load an MPI library through mpi4py "
            f"({exc}). Install one: `pip install mpich` (or `pip install hvdlite[mpich]`), "
            "or a system MPI (Open MPI, Intel MPI) and rebuild mpi4py against it."
        ) from exc
    if MPI.Is_finalized():
        raise RuntimeError(
            "hvdlite.init(): MPI has already been finalized in this process; "
            "it cannot be started again. Call init() before MPI.Finalize()."
        )
    if not MPI.Is_initialized():
        MPI.Init_thread(MPI.THREAD_SERIALIZED if cfg.mpi_threads_disable else MPI.THREAD_MULTIPLE)
        atexit.register(_finalize_mpi, MPI)  # runs after the shutdown registered later
    start_report.ready()
    return MPI


def _finalize_mpi(MPI) -> None:
    """At exit, for MPI that init() initialized: finalize it, as mpi4py would have."""
    if MPI.Is_initialized() and not MPI.Is_finalized():
        MPI.Finalize()


def init(comm=None, process_sets=None) -> None:
    """Start hvdlite on this rank (collective over *comm*, default COMM_WORLD).

    *comm*: None, an mpi4py communicator, or a list of COMM_WORLD ranks (only those
    ranks call init).  *process_sets*: a list of :class:`ProcessSet` to register
    now, or ``"dynamic"`` to allow add/remove later.  Knobs are read from the
    environment now.

    Every rank succeeds or every rank raises: what can fail on one rank alone
    (a bad knob, knobs that differ between ranks, ``process_sets`` that differ,
    rank 0's timeline file) is agreed on before any collective set-up (see
    :mod:`hvdlite.engine.init_agreement`); a failure in the set-up itself ends the job.
    A list that names a set twice (or a set of every rank) is the exception, as in
    Horovod: the job starts with the distinct sets, then every rank raises
    ValueError (see :mod:`hvdlite.engine.initial_sets`).

    A second call while initialized starts nothing; with *process_sets* it gives
    those ProcessSet objects the ids of the registered sets with the same ranks
    (local to each rank; ValueError for a set that is not registered or is listed
    twice).
    """
    global _atexit_registered
    with _init_lock:
        if is_running():
            st = live()
            initial_sets.match_registered(process_sets, st.sets, st.world, _mpi())
            return
        runtime.refuse_in_forked_child()
        error = None
        try:
            cfg = _config.read_config()
        except ValueError as exc:
            cfg, error = _config.Config(), exc
        if not cfg.malloc_tuning_disable:
            _tune_malloc()
        MPI = _import_mpi(cfg)
        world = _world_of(comm, MPI)
        mine, timeline, sample_log = [], None, None
        if error is None:
            try:
                mine = initial_sets.resolve(process_sets, world, MPI)
                if cfg.timeline and world.Get_rank() == 0:
                    timeline = _open_timeline(cfg)
                if cfg.autotune:  # scikit-learn present, rank 0's CSV log writable
                    from . import autotune  # numpy: only once a job asks for it

                    sample_log = autotune.prepare(cfg, world.Get_rank())
            except (ValueError, OSError, ImportError) as exc:
                error = exc
        try:
            per_rank = agree(world, Preparation(error, cfg, [entry for _, entry in mine]))
        except BaseException:
            if timeline is not None:
                timeline.close()
            if sample_log is not None:
                sample_log.close()
            if world not in (MPI.COMM_WORLD, MPI.COMM_SELF):
                world.Free()
            raise
        size = world.Get_size()
        try:
            new = _start(
                world,
                cfg,
                _sets_to_register(initial_sets.union(per_rank, size), mine),
                timeline,
                process_sets == "dynamic",
                MPI,
                sample_log,
            )
        except BaseException as exc:
            _end_job_after_failed_start(world, exc)
            raise
        runtime.install(new)
        global_process_set.mpi_comm = comm if hasattr(comm, "Get_group") else None
        if not _atexit_registered:
            atexit.register(_shutdown_at_exit)
            os.register_at_fork(after_in_child=runtime.forget_after_fork)
            _atexit_registered = True
        _install_excepthooks()
        _say_if_standing_in_for_horovod(world.Get_rank())
        for place in initial_sets.duplicates([entry for _, entry in mine], size):
            ps = mine[place][0]
            if new.sets.get(ps.process_set_id) is not ps:  # as Horovod: no id for a repeat
                ps.process_set_id = None
        repeated = initial_sets.duplicates_message(per_rank, size)
        if repeated:
            raise ValueError(repeated)


def _say_if_standing_in_for_horovod(rank: int) -> None:
    """Once per process, on rank 0: a warning when the program's ``horovod`` is
    hvdlite's stand-in (``hvdrun --as-horovod``, see :mod:`hvdlite.horovod_compat`)."""
    global _said_standing_in
    stand_in = sys.modules.get("horovod")
    if _said_standing_in or not getattr(stand_in, "__hvdlite_stands_in__", False):
        return
    _said_standing_in = True
    if rank == 0:
        log.warning(
            "hvdlite %s stands in for Horovod (hvdrun --as-horovod): `import horovod` "
            "gives hvdlite, which mirrors Horovod %s's API",
            getattr(stand_in, "__hvdlite_version__", "?"),
            getattr(stand_in, "__version__", "?"),
        )


def _mpi():
    from mpi4py import MPI

    return MPI


def _sets_to_register(order: list[list[int]], mine) -> list[tuple[ProcessSet, list[int]]]:
    """The sets every rank registers, in *order*: this rank's own ProcessSet object
    where its list has the set (its first entry of it), a new one where not."""
    own: dict[tuple, ProcessSet] = {}
    for ps, (_, ranks) in mine:
        own.setdefault(tuple(ranks), ps)
    return [(own.get(tuple(ranks)) or ProcessSet(ranks), ranks) for ranks in order]


def _open_timeline(cfg) -> Timeline:
    """Rank 0's timeline from the knobs; an OSError that names the file and the knob."""
    try:
        return Timeline(cfg.timeline, cfg.timeline_mark_cycles)
    except OSError as exc:
        knob = _config.variable_of("timeline")
        raise type(exc)(
            f"the timeline file {cfg.timeline!r} (set by {knob}, hvdrun "
            f"--timeline-filename) cannot be written: {exc.strerror or exc}. Give a path "
            f"in a directory that exists and that you can write, or unset {knob}."
        ) from exc


def _world_of(comm, MPI):
    """The job's communicator for *comm* (see :func:`init`)."""
    if isinstance(comm, (list, tuple)):
        ranks = sorted(int(r) for r in comm)
        group = MPI.COMM_WORLD.Get_group().Incl(ranks)
        world = MPI.COMM_WORLD.Create_group(group)
        group.Free()
    elif comm is None:
        world = MPI.COMM_WORLD
    else:
        world = comm
    if world == MPI.COMM_NULL:
        raise ValueError("init(comm=...) was called on a rank that is not in comm.")
    return world


def _start(world, cfg, set_ranks, timeline, dynamic: bool, MPI, sample_log=None) -> Runtime:
    """The collective set-up every rank runs once they agreed: topology, process
    sets, the engine."""
    new = Runtime()
    new.config = cfg
    new.world = world
    new.thread_level = MPI.Query_thread()
    _configure_logging(cfg.log_level, world.Get_rank(), cfg.log_hide_time)
    _build_topology(new, MPI, cfg)
    core = core_for(
        new.local_comm.Get_rank(),
        new.local_comm.Get_size(),
        {"HVDLITE_THREAD_AFFINITY": cfg.thread_affinity},
    )
    if (
        core is not None
        and hasattr(os, "sched_getaffinity")
        and core not in os.sched_getaffinity(0)
    ):
        raise ValueError(
            f"HVDLITE_THREAD_AFFINITY names core {core}, which this process may "
            f"not use (allowed: {sorted(os.sched_getaffinity(0))})."
        )
    new.sets = ProcessSetTable(world.Get_size(), world.Get_rank(), world.Dup())
    new.dynamic = cfg.dynamic_process_sets or dynamic
    for ps, ranks in set_ranks:
        color = 0 if world.Get_rank() in ranks else MPI.UNDEFINED
        sub = world.Split(color, world.Get_rank())
        new.sets.register(ps, ranks, None if sub == MPI.COMM_NULL else sub)
    new.router = Router(
        world.Get_size(),
        new.node_ranks,
        shared_memory=not cfg.shm_allreduce_disable,
        hierarchical_allreduce=cfg.hierarchical_allreduce,
        hierarchical_allgather=cfg.hierarchical_allgather,
        device=agree_device_choice(world, cfg.hierarchical_allreduce, new.homogeneous),
        node_of=new.node_of,
        ring=not cfg.ring_allreduce_disable,
        half_per_hop=cfg.half_sums_per_hop,
    )
    # The engine and the two-level helper import mpi4py.MPI: only once MPI is set up.
    from .engine.cycle import Engine
    from .engine.transports.hierarchical import Hierarchical

    hierarchical = None
    if cfg.hierarchical_allreduce or cfg.hierarchical_allgather or _tunes_two_levels(cfg, new):
        hierarchical = Hierarchical.create(new)
    new.timeline = timeline
    tuning = None
    if cfg.autotune:
        from . import autotune

        tuning = autotune.tuning_for(
            cfg, world.Get_rank(), world.Get_size(), new.router, hierarchical, sample_log
        )
    new.engine = Engine(
        world,
        cfg,
        new.sets,
        new.router,
        timeline=new.timeline,
        hierarchical=hierarchical,
        overlap=_overlap(cfg, new),
        core=core,
        tuning=tuning,
    )
    return new


def _tunes_two_levels(cfg, new: Runtime) -> bool:
    """Whether autotune will try hierarchical allreduce (the same on every rank:
    the knobs agree and every rank knows every rank's node)."""
    if not cfg.autotune:
        return False
    from .autotune import two_levels_worth_trying

    return two_levels_worth_trying(collections.Counter(new.node_of).values())


def _end_job_after_failed_start(world, exc: BaseException) -> None:
    """The collective set-up failed here after every rank agreed to go on: the
    others may be blocked in it, so a job of several ranks ends now."""
    if world.Get_size() <= 1:
        return
    sys.stderr.write(
        f"hvdlite.init() failed on rank {world.Get_rank()} during the collective "
        f"set-up; ending the job: {exc!r}\n"
    )
    _abort(1)


def _tune_malloc() -> None:
    """glibc: stop returning freed heap memory to the OS, and serve blocks up to 32 MiB
    from the heap.  MPI and the frameworks allocate and free large temporaries every
    step; with glibc's defaults each one is a fresh mmap and thousands of page faults."""
    import ctypes
    import platform

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        libc.mallopt(m_mmap_threshold, 32 << 20)
        libc.mallopt(m_trim_threshold, 1 << 30)
    except (OSError, AttributeError):  # not glibc after all: nothing to tune
        pass


def _build_topology(st: Runtime, MPI, cfg) -> None:
    world = st.world
    node = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.Get_rank())
    st.node_ranks = frozenset(node.allgather(world.Get_rank()))
    if cfg.test_node_size > 0:  # simulated nodes (tests): the real node is only asked above
        node.Free()
        first = world.Get_rank() // cfg.test_node_size * cfg.test_node_size
        st.node_ranks = st.node_ranks & frozenset(range(first, first + cfg.test_node_size))
        st.local_comm = world.Split(world.Get_rank() // cfg.test_node_size, world.Get_rank())
    else:
        st.local_comm = node
    st.cross_comm = world.Split(st.local_comm.Get_rank(), world.Get_rank())
    layout = world.allgather((st.local_comm.Get_size(), min(st.node_ranks)))
    st.homogeneous = len({size for size, _ in layout}) == 1
    st.node_of = tuple(node for _, node in layout)


# --- the running job, as the framework adapters see it ------------------------
# The adapters (hvdlite.torch, hvdlite.tensorflow, hvdlite.keras) reach the engine
# only through the public modules and these functions, which are not exported:
# ``make lint`` (tools/import_graph.py) fails when an adapter imports hvdlite.engine.


def allreduce_uses_shared_memory(process_set) -> bool:
    """Whether large allreduces over *process_set* are planned to run through the
    node's shared memory (:mod:`hvdlite.engine.transports.shm`); the set's
    :class:`~hvdlite.engine.transports.routes.Routes` decide, the same on every member."""
    return routes_of(process_set).allreduce is Transport.SHARED_MEMORY


def reducescatter_uses_shared_memory(process_set) -> bool:
    """Whether large host reduce-scatters over *process_set* run through the node's
    shared memory (:mod:`hvdlite.engine.transports.shm_scatter`); decided as
    :func:`allreduce_uses_shared_memory` is."""
    return routes_of(process_set).reducescatter is Transport.SHARED_MEMORY


def halves_cross_as_16_bits(process_set) -> bool:
    """Whether large float16 and bfloat16 allreduces over *process_set* cross nodes
    with 16-bit values (:mod:`hvdlite.engine.transports.half_wire`): its ranks are
    on more than one node.  An adapter then hands them to the engine as they are
    (bfloat16 as numpy's, :data:`hvdlite.util.dtypes.BFLOAT16`) rather than as
    float32 copies."""
    return routes_of(process_set).half_allreduce is Transport.HALF_WIRE


def reductions_overlap_compute() -> bool:
    """Whether some rank's engine thread has a core of its own (agreed at
    ``init()``, the same on every rank): then an adapter starts reductions while
    the framework still computes; otherwise it hands them over together."""
    return live().engine.overlap_anywhere


def job_config():
    """The knobs the running job was initialized with (a :class:`hvdlite.config.Config`)."""
    return state().config


def registered_process_set(set_id: int) -> ProcessSet | None:
    """The registered process set with id *set_id*, or None."""
    return state().sets.get(int(set_id))


def device_choice():
    """The device path the job agreed on at ``init()`` (a
    :class:`hvdlite.device.selection.DeviceChoice`), or None where no rank could
    take one."""
    return getattr(live().router, "device", None)


def _overlap(cfg, st: Runtime) -> bool:
    """HVDLITE_OVERLAP resolved: auto means on when this process may use more cores
    than there are ranks on its node (a core is left for the engine thread)."""
    if cfg.overlap != "auto":
        return cfg.overlap == "on"
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return cores > st.local_comm.Get_size()


def _install_excepthooks() -> None:
    """An uncaught exception on one rank, in any thread, ends the whole job instead
    of hanging its peers (in a job of one rank there is nobody to hang)."""
    if not getattr(sys.excepthook, "_hvdlite", False):
        previous = sys.excepthook

        def hook(exc_type, exc, tb):
            previous(exc_type, exc, tb)
            if _peers_would_hang():
                _abort(1)

        hook._hvdlite = True
        sys.excepthook = hook
    if not getattr(threading.excepthook, "_hvdlite", False):
        previous_thread_hook = threading.excepthook

        def thread_hook(args):
            previous_thread_hook(args)
            if args.exc_type is not SystemExit and _peers_would_hang():
                _abort(1)

        thread_hook._hvdlite = True
        threading.excepthook = thread_hook


def _peers_would_hang() -> bool:
    """A job of several ranks whose engine still runs here, or stopped mid-cycle
    (an interrupt): the peers cannot finish without this rank."""
    st = runtime.current()
    if st is None or st.engine is None or st.world.Get_size() <= 1:
        return False
    return not st.engine.stopped or st.engine.interrupted is not None


def _abort(code: int) -> None:
    runtime.abort_job(code)


def shutdown() -> None:
    """Stop the engine on every rank; pending collectives fail with HorovodInternalError."""
    with _init_lock:
        st = runtime.current()
        if st is None or st.engine is None:
            return
        _end_job_after_interrupt(st)  # the other ranks could never meet this one again
        if not st.engine.request_shutdown(timeout=60.0):
            log.warning("hvdlite engine did not stop within 60 s (a peer rank is unresponsive)")
            return
        if st.timeline is not None:
            st.timeline.close()
        st.sets.free_all()
        for c in (st.local_comm, st.cross_comm):
            try:
                c.Free()
            except Exception:  # noqa: BLE001
                pass
        from mpi4py import MPI

        if st.world not in (MPI.COMM_WORLD, MPI.COMM_SELF):
            try:
                st.world.Free()
            except Exception:  # noqa: BLE001
                pass
        st.engine = None
        runtime.clear()


def _end_job_after_interrupt(st) -> None:
    """A Ctrl-C or sys.exit() broke a cycle here and peers wait inside it: end the
    job (with the SystemExit's code, else 1).  Nothing to do alone."""
    if st is None or st.engine is None or st.engine.interrupted is None or st.world.Get_size() <= 1:
        return
    code = getattr(st.engine.interrupted, "code", None)
    _abort(code if isinstance(code, int) and code else 1)


def _shutdown_at_exit() -> None:
    _end_job_after_interrupt(runtime.current())
    try:
        shutdown()
    except Exception:  # noqa: BLE001 - never turn a clean exit into a traceback
        pass


def is_initialized() -> bool:
    return is_running()


def _get_process_set_ids_and_ranks() -> dict[int, list[int]]:
    """Every registered process set: id -> its global ranks, the global set (0)
    included (Horovod's internal helper, which its tests call; local)."""
    table = live().sets
    return {set_id: list(table.ranks[set_id]) for set_id in sorted(table.ranks)}


def size() -> int:
    """Number of ranks in the job."""
    return live().world.Get_size()


def rank() -> int:
    """This process's rank in the job (0 .. size()-1)."""
    return live().world.Get_rank()


def local_size() -> int:
    """Number of ranks on this node."""
    return live().local_comm.Get_size()


def local_rank() -> int:
    """This process's rank among the ranks on its node."""
    return live().local_comm.Get_rank()


def cross_size() -> int:
    """Number of nodes that have a rank with this process's local rank."""
    return live().cross_comm.Get_size()


def cross_rank() -> int:
    """This node's index among those nodes."""
    return live().cross_comm.Get_rank()


def is_homogeneous() -> bool:
    """True when every node runs the same number of ranks."""
    return live().homogeneous


def mpi_threads_supported() -> bool:
    from mpi4py import MPI

    return live().thread_level >= MPI.THREAD_MULTIPLE


def mpi_enabled() -> bool:
    return True


def mpi_built() -> bool:
    return True


def gloo_enabled() -> bool:
    return False


def gloo_built() -> bool:
    return False


def nccl_built() -> int:
    """The NCCL version this process can use through CuPy (e.g. 22703), or 0: no CuPy,
    no visible CUDA device, or no loadable NCCL.  Never imports CUDA on CPU hosts."""
    return nccl_version()


def cuda_built() -> bool:
    """True when this process can move CUDA tensors: CuPy imports and sees a device."""
    return cuda_available()


def rocm_built() -> bool:
    return False


def ddl_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start writing a timeline (Chrome trace, see :mod:`hvdlite.timeline`) to *file_path*.

    Call it on every rank, as Horovod does; rank 0 writes the file (its
    coordinator sees every rank's reports), the others do nothing.  A timeline
    already running is ended first.  *mark_cycles*: also draw every engine cycle.
    Local: no rank waits for another.  ``OSError`` if rank 0 cannot open the file.
    """
    st = state()
    if st.world.Get_rank() != 0:
        return
    try:
        timeline = Timeline(file_path, mark_cycles)
    except OSError as exc:
        raise type(exc)(
            f"hvd.start_timeline: the timeline file {file_path!r} cannot be written: "
            f"{exc.strerror or exc}"
        ) from exc
    old, st.timeline = st.timeline, timeline
    st.engine.timeline = st.timeline  # the engine switches at its next cycle or batch
    if old is not None:
        old.close()


def stop_timeline() -> None:
    """End the timeline (every rank may call it; only rank 0 has one): what was
    recorded is written and the JSON closed."""
    st = state()
    old, st.timeline = st.timeline, None
    if old is not None:
        st.engine.timeline = None
        old.close()
