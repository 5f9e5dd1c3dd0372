"""hvdlite.run / hvdlite.runner.run (Horovod's horovod.run): real jobs at 1, 2 and 3 ranks.

The functions the ranks run are at module level here (the ranks import this module:
run() gives them this process's sys.path), or, in a script run as a subprocess,
defined in ``__main__`` and in closures, which only cloudpickle can ship.
"""

import contextlib
import io
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from helpers_runner.common import ROOT, clean_env

import hvdlite
from hvdlite.runner import RankFailedError, rankenv
from hvdlite.runner.runfunc import _elastic_argv, _elastic_hosts_are_remote


def _rank_and_args(base, scale=1):
    me = rankenv.from_environ()
    print(f"hello from {me.rank}")
    return me.rank, me.size, base * scale


def _fail_on_rank_1():
    me = rankenv.from_environ()
    if me.rank == 1:
        raise ValueError(f"rank {me.rank} fails on purpose")
    time.sleep(30)  # the others wait until hvdrun stops them
    return me.rank


def _collectives():
    import numpy as np

    hvdlite.init()
    total = hvdlite.allreduce(np.array([float(hvdlite.rank())]), op=hvdlite.Sum)
    names = hvdlite.allgather_object(f"r{hvdlite.rank()}")
    return hvdlite.rank(), hvdlite.size(), float(total[0]), names


def _elastic_train(steps):
    """Sums one allreduce per step in an ObjectState, committing each step; rank 1 kills
    itself at step 3 of the first launch."""
    import numpy as np

    from hvdlite.elastic import ObjectState
    from hvdlite.elastic import run as elastic_run

    hvdlite.init()
    launch = int(os.environ["HVDLITE_ELASTIC_GENERATION"])
    state = ObjectState(step=0, total=0.0)

    @elastic_run
    def train(state):
        while state.step < steps:
            if launch == 0 and hvdlite.rank() == 1 and state.step == 3:
                os.kill(os.getpid(), signal.SIGKILL)
            state.total += float(hvdlite.allreduce(np.ones(1), op=hvdlite.Sum)[0])
            state.step += 1
            state.commit()
        return hvdlite.rank(), hvdlite.size(), state.step, state.total, launch

    return train(state)


def _always_fails_on_rank_1():
    hvdlite.init()
    launch = os.environ["HVDLITE_ELASTIC_GENERATION"]
    if hvdlite.rank() == 1:
        raise ValueError(f"rank 1 fails in launch {launch}")
    hvdlite.barrier()


def _secret_seen(name, secret):
    """Whether this rank has *secret* in its environment, and every process on this machine
    whose command line holds it (what any local user sees with ``ps``)."""
    needle, shown = secret.encode(), []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                if needle in handle.read():
                    shown.append(entry)
        except OSError:
            continue
    return os.environ.get(name) == secret, shown


@pytest.mark.timeout(120)
def test_secrets_from_env_never_reach_a_command_line(capfd):
    # hvdlite.run(env=...) values used to be mpiexec arguments (-genv NAME VALUE): any local
    # user saw them in ps, and --verbose printed them into the job's log.
    secret = "s3cr3t-" + os.urandom(6).hex()
    values = hvdlite.run(
        _secret_seen,
        args=("MY_API_TOKEN", secret),
        np=2,
        env={"MY_API_TOKEN": secret, "HVDLITE_CYCLE_TIME": "3"},
        verbose=True,
    )
    assert values == [(True, []), (True, [])]
    printed = capfd.readouterr()
    assert "MY_API_TOKEN='***' " in printed.err and "HVDLITE_CYCLE_TIME=3" in printed.err
    assert secret not in printed.out + printed.err


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [1, 2, 3])
def test_values_come_back_in_rank_order(n, tmp_path, capfd):
    values = hvdlite.run(_rank_and_args, args=(3,), kwargs={"scale": 2}, np=n, work_dir=tmp_path)
    assert values == [(rank, n, 6) for rank in range(n)]
    out = capfd.readouterr().out
    for rank in range(n):  # the ranks' output passes through, with the launcher's prefix
        assert f"[{rank}] hello from {rank}" in out, out
    assert list(tmp_path.iterdir()) == []  # the exchange directory is gone


@pytest.mark.timeout(120)
def test_output_reaches_a_text_only_stdout():
    """A notebook's sys.stdout is a text stream without .buffer."""
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        assert hvdlite.run(_rank_and_args, args=(1,), np=2) == [(0, 2, 1), (1, 2, 1)]
    assert "[0] hello from 0" in text.getvalue() and "[1] hello from 1" in text.getvalue()


@pytest.mark.timeout(120)
def test_failing_rank_raises_with_its_traceback(capfd):
    started = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        hvdlite.run(_fail_on_rank_1, np=3)
    assert time.monotonic() - started < 20  # the sleeping ranks were stopped
    error = info.value
    assert isinstance(error, RuntimeError)
    assert (error.rank, error.exception_type) == (1, "ValueError")
    assert "_fail_on_rank_1() raised ValueError: rank 1 fails on purpose" in str(error)
    assert 'raise ValueError(f"rank {me.rank} fails on purpose")' in error.remote_traceback
    assert "in _fail_on_rank_1" in str(error) and "run_task" not in error.remote_traceback
    assert "the job failed: rank 1 on host" in capfd.readouterr().err  # hvdrun's report


@pytest.mark.timeout(120)
def test_collectives_inside_the_function():
    values = hvdlite.run(_collectives, np=3)
    assert values == [(rank, 3, 3.0, ["r0", "r1", "r2"]) for rank in range(3)]


NOTEBOOK = textwrap.dedent("""
    import hvdlite

    def times(k):
        return lambda x: x * k          # a closure, returning a lambda

    offset = 10

    def defined_in_main(x):
        return x + offset               # reads a global of __main__

    print("closure", hvdlite.run(times(3), args=(2,), np=2))
    print("main", hvdlite.run(defined_in_main, args=(1,), np=2))
""")


@pytest.mark.timeout(120)
def test_closures_and_functions_from_main_with_cloudpickle(tmp_path):
    pytest.importorskip("cloudpickle")
    script = tmp_path / "notebook_like.py"
    script.write_text(NOTEBOOK)
    out = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=100,
        env=clean_env(),
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "closure [6, 6]" in out.stdout and "main [11, 11]" in out.stdout, out.stdout


WITHOUT_CLOUDPICKLE = textwrap.dedent("""
    import math, sys
    sys.modules["cloudpickle"] = None          # as if it were not installed
    import hvdlite
    def outer(k):
        def inner():
            return k
        return inner
    for func in (lambda: 1, outer(2)):
        try:
            hvdlite.run(func, np=2)
        except TypeError as exc:
            print("refused:", exc)
    def in_main():
        return 1
    try:
        hvdlite.run(in_main, np=2)
    except TypeError as exc:
        print("refused:", exc)
    print("importable", hvdlite.run(math.factorial, args=(5,), np=2))
""")


@pytest.mark.timeout(120)
def test_without_cloudpickle_only_importable_functions_go(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", WITHOUT_CLOUDPICKLE],
        capture_output=True,
        text=True,
        timeout=100,
        env=clean_env(),
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    refusals = [line for line in out.stdout.splitlines() if line.startswith("refused:")]
    assert len(refusals) == 3, out.stdout
    assert "is a lambda" in refusals[0] and "is a closure" in refusals[1]
    assert "defined in __main__" in refusals[2]
    assert all("pip install 'hvdlite[cloudpickle]'" in line for line in refusals)
    assert "importable [120, 120]" in out.stdout


@pytest.mark.timeout(120)
def test_an_elastic_run_survives_a_killed_rank_and_returns_the_last_launch(tmp_path, capfd):
    values = hvdlite.run(
        _elastic_train,
        args=(6,),
        np=2,
        max_restarts=1,
        work_dir=tmp_path,
        elastic_state_dir=tmp_path / "state",
    )
    # launch 0 committed steps 1-3 (total 6); launch 1 resumed there and did steps 4-6
    assert values == [(0, 2, 6, 12.0, 1), (1, 2, 6, 12.0, 1)]
    err = capfd.readouterr().err
    assert "relaunching (restart 1 of 1)" in err and "resuming from commit 3" in err, err
    assert [p.name for p in tmp_path.iterdir()] in ([], ["state"])


@pytest.mark.timeout(120)
def test_an_elastic_run_that_spends_its_restarts_raises_the_last_launchs_error(tmp_path):
    with pytest.raises(RankFailedError, match="rank 1 fails in launch 1") as info:
        hvdlite.run(
            _always_fails_on_rank_1,
            np=2,
            max_restarts=1,
            work_dir=tmp_path,
            elastic_state_dir=tmp_path / "state",
        )
    assert info.value.rank == 1


def test_elastic_arguments_become_hvdruns_flags():
    assert _elastic_argv(None, None, None, None, None, None, None, None, None) == []
    assert _elastic_argv(2, 4, 2, 3, (10, 60), "./hosts.sh", 5, 30, "/shared/s") == [
        "--min-np",
        "2",
        "--max-np",
        "4",
        "--slots-per-host",
        "2",
        "--reset-limit",
        "3",
        "--max-restarts",
        "5",
        "--elastic-timeout",
        "30",
        "--blacklist-cooldown-range",
        "10",
        "60",
        "--host-discovery-script",
        "./hosts.sh",
        "--elastic-state-dir",
        "/shared/s",
    ]


def test_elastic_jobs_that_may_leave_this_host_exchange_results_in_a_shared_directory():
    local = {"PATH": "/usr/bin"}
    assert not _elastic_hosts_are_remote(None, None, None, local)
    assert _elastic_hosts_are_remote("a:2,b:2", None, None, local)
    assert _elastic_hosts_are_remote(None, "hosts.txt", None, local)
    assert _elastic_hosts_are_remote(None, None, "./discover.sh", local)
    assert _elastic_hosts_are_remote(None, None, None, {**local, "SLURM_JOB_ID": "42"})


def test_bad_arguments_are_refused_before_anything_starts(tmp_path):
    with pytest.raises(ValueError, match="--min-np/--max-np need hosts that can change"):
        hvdlite.run(_rank_and_args, args=(1,), np=2, min_np=1)
    with pytest.raises(ValueError, match=r"cooldown_range must be \(min, max\)"):
        hvdlite.run(_rank_and_args, args=(1,), np=2, max_restarts=1, cooldown_range=5)
    with pytest.raises(ValueError, match="use_gloo: hvdlite has no Gloo"):
        hvdlite.run(_rank_and_args, args=(1,), use_gloo=True)
    with pytest.raises(ValueError, match="either hosts or hostfile"):
        hvdlite.run(_rank_and_args, args=(1,), hosts="a:1", hostfile="h")
    with pytest.raises(ValueError, match="-np"):
        hvdlite.run(_rank_and_args, args=(1,), np=0)
    with pytest.raises(ValueError, match="np=2 and num_proc=3"):
        hvdlite.run(_rank_and_args, args=(1,), np=2, num_proc=3)
    with pytest.raises(TypeError, match="func must be callable"):
        hvdlite.run(42)
    with pytest.raises(TypeError, match=r"args=\(value,\)"):
        hvdlite.run(_rank_and_args, args=1)
    with pytest.raises(ValueError, match="command not found"):
        hvdlite.run(_rank_and_args, args=(1,), executable="no-such-python-hvdlite")


@pytest.mark.timeout(60)
def test_run_is_exported_lazily():
    code = (
        "import sys, hvdlite, hvdlite.runner; "
        "assert 'hvdlite.runner.runfunc' not in sys.modules; "
        "assert hvdlite.run is hvdlite.runner.run is hvdlite.runner.runfunc.run; "
        "assert 'run' in hvdlite.__all__; "
        "print(sorted(m for m in ('mpi4py', 'numpy', 'torch', 'tensorflow') "
        "if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=50,
        env=clean_env(),
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
