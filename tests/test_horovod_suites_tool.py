"""tools/horovod_suites.py and its shim: what `make test-horovod` relies on."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import horovod_suites  # noqa: E402

sys.path.remove(str(ROOT / "tools"))


def test_the_stand_in_serves_hvdlite_under_horovods_names():
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
        "collected 3 items\n"
        "test_torch.py::TorchTests::test_a PASSED [ 50%]\n"
        "test_torch.py::TorchTests::test_b PASSED [100%]\n"
    )
    (tmp_path / "rank1.log").write_text(
        "collected 3 items\n"
        "test_torch.py::TorchTests::test_a PASSED [ 50%]\n"
        "test_torch.py::TorchTests::test_b FAILED [100%]\n"
        "test_torch.py::TorchTests::test_c ERROR\n"
    )
    attempt = horovod_suites.Attempt(sorted(tmp_path.glob("rank*.log")), finished=True)
    assert attempt.settled() == {
        "TorchTests::test_a": "PASSED",
        "TorchTests::test_b": "FAILED",
        "TorchTests::test_c": "FAILED",
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


def test_a_test_whose_subtest_failed_counts_as_failed(tmp_path):
    # pytest reports the test PASSED; the rank plugin's line after it says it failed.
    log = tmp_path / "rank0.log"
    log.write_text(
        "collected 2 items\n"
        "test_tensorflow.py::TensorFlowTests::test_a \n"
        "test_tensorflow.py::TensorFlowTests::test_a PASSED [ 50%]\n"
        "\ntest_tensorflow.py::TensorFlowTests::test_a FAILED (a part of it failed on this rank)\n"
        "test_tensorflow.py::TensorFlowTests::test_b PASSED [100%]\n"
    )
    assert horovod_suites.rank_results(log) == {
        "TensorFlowTests::test_a": "FAILED",
        "TensorFlowTests::test_b": "PASSED",
    }


def test_deselected_lines_are_expected_failures_that_do_not_run(tmp_path):
    sample = tmp_path / "expected.txt"
    sample.write_text("torch::test_x  # runs\ndeselect torch::test_y@3  # parts the ranks\n")
    assert horovod_suites.expected_failures(sample) == {
        "torch::test_x": "runs",
        "torch::test_y@3": "parts the ranks",
    }
    assert horovod_suites.deselected(sample) == {"torch::test_y@3": "parts the ranks"}
    assert horovod_suites._applies("torch::test_y@3", "torch", 3) == "test_y"
    assert horovod_suites._applies("torch::test_y@3", "torch", 2) is None
    assert horovod_suites._applies("torch::test_x", "tensorflow", 2) is None


def _rank_log(path, collected, lines):
    path.write_text(
        f"collected {collected} items\n"
        + "".join(f"test_torch.py::TorchTests::{line}\n" for line in lines)
    )
    return path


def test_a_run_the_ranks_parted_in_settles_what_it_can_and_names_where_it_stopped(tmp_path):
    # Rank 1 failed test_w and went on to test_x, where it waits; rank 0 hangs in test_w.
    logs = [
        _rank_log(tmp_path / "rank0.log", 4, ["test_v ", "test_v PASSED", "test_w "]),
        _rank_log(
            tmp_path / "rank1.log",
            4,
            ["test_v ", "test_v PASSED", "test_w ", "test_w FAILED", "test_x "],
        ),
    ]
    attempt = horovod_suites.Attempt(logs, finished=True)
    assert attempt.settled() == {"TorchTests::test_v": "PASSED", "TorchTests::test_w": "FAILED"}
    assert attempt.culprit() == "TorchTests::test_w"  # test_x, where rank 1 waits, runs again


def test_a_hang_costs_one_test_and_the_run_resumes_after_it(tmp_path, monkeypatch):
    runs = []

    def fake_run_once(src, suite, size, timeout, test_timeout, mpiexec, select, leave_out):
        runs.append(set(leave_out))
        run_dir = tmp_path / str(len(runs))
        run_dir.mkdir()
        if len(runs) == 1:  # hangs in test_b on both ranks
            lines = ["test_a ", "test_a PASSED", "test_b "]
            return horovod_suites.Attempt(
                [_rank_log(run_dir / f"rank{r}.log", 3, lines) for r in range(2)], True
            )
        lines = ["test_c ", "test_c PASSED"]
        return horovod_suites.Attempt(
            [_rank_log(run_dir / f"rank{r}.log", 1, lines) for r in range(2)], True
        )

    monkeypatch.setattr(horovod_suites, "run_once", fake_run_once)
    outcome, notes = horovod_suites.run_suite(
        tmp_path, "torch", 2, 60, 10, "mpiexec", None, {"test_skipped"}
    )
    assert outcome == {
        "TorchTests::test_a": "PASSED",
        "TorchTests::test_b": "FAILED",
        "TorchTests::test_c": "PASSED",
    }
    assert runs == [{"test_skipped"}, {"test_skipped", "TorchTests::test_a", "TorchTests::test_b"}]
    assert notes == ["a run ended early in TorchTests::test_b"]
