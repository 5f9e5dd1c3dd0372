"""`hvdrun --as-horovod`: programs written for Horovod run unchanged, and only with the flag.

Real jobs of the unchanged scripts in tests/horovod_scripts (torch and Keras, written as
Horovod's documentation writes them) at 2 ranks, the same torch script failing without
the flag, and what ``import horovod`` serves in a process that has hvdlite's stand-in
on its path (hvdlite/horovod_compat).
"""

import importlib.util
import subprocess
import sys

import pytest
from helpers_runner.common import ROOT, clean_env, hvdrun

from hvdlite import horovod_compat

PY = sys.executable
SCRIPTS = ROOT / "tests" / "horovod_scripts"
STANDS_IN = "stands in for Horovod (hvdrun --as-horovod)"


def _trained_alike(result, n: int = 2) -> None:
    assert result.returncode == 0, result.output
    for rank in range(n):
        line = f"[{rank}] rank {rank} of {n}: weights the same on every rank: True"
        assert line in result.stdout, result.output
    assert result.output.count(STANDS_IN) == 1, result.output  # once, from rank 0


@pytest.mark.timeout(180)
def test_an_unchanged_horovod_torch_script_runs_with_the_flag_only():
    assert importlib.util.find_spec("horovod") is None, "a real Horovod is installed here"
    result = hvdrun("--as-horovod", "-np", "2", PY, str(SCRIPTS / "torch_train.py"), timeout=150)
    _trained_alike(result)
    assert "[0] epoch 2 loss" in result.stdout, result.output

    without = hvdrun("-np", "2", PY, str(SCRIPTS / "torch_train.py"), timeout=90)
    assert without.returncode != 0
    assert "ModuleNotFoundError: No module named 'horovod'" in without.output, without.output
    assert STANDS_IN not in without.output


@pytest.mark.timeout(240)
def test_an_unchanged_horovod_keras_script_runs_with_the_flag():
    pytest.importorskip("tensorflow")
    result = hvdrun("--as-horovod", "-np", "2", PY, str(SCRIPTS / "keras_train.py"), timeout=210)
    _trained_alike(result)


def _in_stand_in(code: str, **env: str) -> subprocess.CompletedProcess:
    environ = clean_env(**env)
    environ.update(horovod_compat.rank_environment(environ))
    return subprocess.run(
        [PY, "-c", code], env=environ, capture_output=True, text=True, timeout=120, cwd=ROOT
    )


@pytest.mark.timeout(150)
def test_horovods_module_names_give_hvdlites_and_what_is_missing_says_so():
    code = """
import importlib.util
import horovod, horovod.torch as hvd, hvdlite, hvdlite.torch
import horovod.torch.elastic, hvdlite.torch.elastic
from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
from horovod.common.util import env, mpi_built
from horovod.runner.common.util.env import get_env_rank_and_size
assert hvd is hvdlite.torch and horovod.torch.elastic is hvdlite.torch.elastic
assert horovod.torch.elastic.TorchState is hvdlite.torch.elastic.TorchState
assert HorovodInternalError is hvdlite.HorovodInternalError
assert HostsUpdatedInterrupt is hvdlite.HostsUpdatedInterrupt
assert horovod.run is hvdlite.runner.run and horovod.runner.run is hvdlite.runner.run
assert horovod.__version__ == "0.28.1" and horovod.__hvdlite_version__ == hvdlite.__version__
assert mpi_built() and get_env_rank_and_size() == (0, 1)
assert importlib.util.find_spec("horovod.no_such_module") is None
assert importlib.util.find_spec("horovod.torch.no_such_module") is None
for name, what in [("horovod.spark", "Spark"), ("horovod.ray", "Ray"),
                   ("horovod.torch.mpi_lib_v2", "compiled library"),
                   ("horovod.runner.gloo_run", "hvdrun")]:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as exc:
        assert exc.name == name and what in str(exc) and "real Horovod" in str(exc), exc
    else:
        raise AssertionError(name + " imported")
print("ok")
"""
    result = _in_stand_in(code)
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr


@pytest.mark.timeout(150)
def test_horovod_run_starts_ranks_that_see_horovod_too(tmp_path):
    (tmp_path / "job_fn.py").write_text(
        "def rank_size_and_stand_in():\n"
        "    import horovod\n"
        "    from horovod.runner.common.util.env import get_env_rank_and_size\n"
        "    return get_env_rank_and_size(), horovod.__hvdlite_stands_in__\n"
    )
    code = (
        "import sys\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "import horovod, job_fn\n"
        "print(horovod.run(job_fn.rank_size_and_stand_in, np=2))\n"
    )
    result = _in_stand_in(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("[((0, 2), True), ((1, 2), True)]"), result.stdout
