"""tools/horovod_suites.py and its shim: what `make test-horovod` relies on."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import horovod_suites  # noqa: E402

sys.path.remove(str(ROOT / "tools"))


def test_the_shim_serves_hvdlite_under_horovods_names():
    code = (
        "import horovod.torch as hvd, hvdlite.torch\n"
        "assert hvd is hvdlite.torch\n"
        "from horovod.torch import mpi_ops\n"
        "assert mpi_ops is hvdlite.torch.mpi_ops\n"
        "from horovod.runner.util.threads import in_thread\n"
        "box = []\n"
        "in_thread(box.append, (1,)).join()\n"
        "assert box == [1]\n"
        "from horovod.common.util import mpi_built\n"
        "import importlib.util\n"
        "assert importlib.util.find_spec('horovod.no_such_module') is None\n"
    )
    env = {"PYTHONPATH": f"{horovod_suites.SHIM}:{ROOT}", "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr


def test_a_test_failed_on_any_rank_counts_as_failed(tmp_path):
    (tmp_path / "rank0.log").write_text(
        "test_torch.py::TorchTests::test_a PASSED [ 50%]\n"
        "test_torch.py::TorchTests::test_b PASSED [100%]\n"
    )
    (tmp_path / "rank1.log").write_text(
        "test_torch.py::TorchTests::test_a PASSED [ 50%]\n"
        "test_torch.py::TorchTests::test_b FAILED [100%]\n"
        "test_torch.py::TorchTests::test_c ERROR\n"
    )
    outcome = horovod_suites.results_of(sorted(tmp_path.glob("rank*.log")))
    assert outcome == {
        "test_torch.py::TorchTests::test_a": "PASSED",
        "test_torch.py::TorchTests::test_b": "FAILED",
        "test_torch.py::TorchTests::test_c": "FAILED",
    }


def test_the_expectations_file_parses_and_every_line_has_a_reason(tmp_path):
    listed = horovod_suites.expected_failures()
    assert all(reason for reason in listed.values())
    sample = tmp_path / "expected.txt"
    sample.write_text("# comment\n\ntorch::test_x  # a reason\ntorch::test_y@3  # another\n")
    assert horovod_suites.expected_failures(sample) == {
        "torch::test_x": "a reason",
        "torch::test_y@3": "another",
    }


def test_a_source_without_the_suites_is_refused_with_the_fix(tmp_path):
    with pytest.raises(SystemExit, match="HOROVOD_SRC must be a checkout"):
        horovod_suites.horovod_source(str(tmp_path))


def test_a_run_that_stopped_early_says_where(tmp_path):
    log = tmp_path / "rank0.log"
    log.write_text(
        "collecting ... collected 3 items\n"
        "test_torch.py::TorchTests::test_a PASSED [ 33%]\n"
        "test_torch.py::TorchTests::test_join \n"
    )
    outcome = horovod_suites.results_of([log])
    assert (
        horovod_suites.ended_early(log, outcome) == "1 of 3 tests reported; it stopped in test_join"
    )
    log.write_text(
        "collected 2 items / 1 deselected\ntest_torch.py::TorchTests::test_a PASSED [100%]\n"
    )
    assert horovod_suites.ended_early(log, horovod_suites.results_of([log])) is None
