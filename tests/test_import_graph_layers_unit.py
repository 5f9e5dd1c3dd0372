"""tools/import_graph.py's layer check: it passes on this tree and fails on an import up."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def import_graph():
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import import_graph
    finally:
        sys.path.remove(str(ROOT / "tools"))
    return import_graph


def _run(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(root / "tools" / "import_graph.py")],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_this_tree_has_no_import_up_and_no_cycle(import_graph):
    edges = import_graph.graph()
    assert import_graph.cycles(edges) == []
    assert import_graph.layering_violations(edges) == []
    done = _run(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_lazy_import_up_in_a_copy_of_the_tree_fails_the_check(tmp_path):
    # A copy of the package and the tool, with one function-local import from
    # device memory up into the engine's loop: the check must name it and exit 1.
    shutil.copytree(ROOT / "hvdlite", tmp_path / "hvdlite", ignore=shutil.ignore_patterns("*.pyc"))
    (tmp_path / "tools").mkdir()
    shutil.copy(ROOT / "tools" / "import_graph.py", tmp_path / "tools")
    with open(tmp_path / "hvdlite" / "device" / "arrays.py", "a") as f:
        f.write("\n\ndef _up():\n    from ..engine.cycle import Engine\n\n    return Engine\n")
    done = _run(tmp_path)
    assert done.returncode == 1
    assert "layering: hvdlite.device.arrays imports hvdlite.engine.cycle" in done.stdout


@pytest.mark.parametrize(
    "source, target, words",
    [
        ("hvdlite.engine.transports.shm", "hvdlite.engine.cycle", "from the transports layer"),
        ("hvdlite.util.splits", "hvdlite.engine.transports.shm", "device memory and leaves"),
        ("hvdlite.process_sets", "hvdlite.engine.runtime", "to the engine layer"),
        ("hvdlite.timeline.schema", "hvdlite.timeline.events", "to the API layer"),
        ("hvdlite.tensorflow.mpi_ops", "hvdlite.keras.optimizer", "to the Keras 3 layer"),
        ("hvdlite.keras.optimizer", "hvdlite.tensorflow.keras", "to the front doors layer"),
        ("hvdlite.basics", "hvdlite.torch.optimizer", "to the adapters and launcher layer"),
        ("hvdlite.device.backend", "hvdlite.engine.messages", "imports nothing of it"),
        ("hvdlite.jax.mpi_ops", "hvdlite.engine.runtime", "not hvdlite.engine"),
    ],
)
def test_each_import_up_is_named(import_graph, source, target, words):
    found = import_graph.layering_violations({source: {target}, target: set()})
    assert len(found) == 1
    assert found[0].startswith(f"{source} imports {target}:") and words in found[0]


@pytest.mark.parametrize(
    "source, target",
    [
        ("hvdlite.tensorflow", "hvdlite.tensorflow.keras"),  # the front door's Keras path
        ("hvdlite.keras._backend_tensorflow", "hvdlite.tensorflow.gradient_reduction"),
        ("hvdlite.collectives", "hvdlite.engine.runtime"),
        ("hvdlite.engine.executor", "hvdlite.engine.transports.shm"),
        ("hvdlite.engine.transports.device", "hvdlite.device.registry"),
        ("hvdlite.engine.transports.shm", "hvdlite.engine.messages"),
        ("hvdlite.timeline.events", "hvdlite.engine.messages"),
    ],
)
def test_imports_down_or_within_a_layer_pass(import_graph, source, target):
    assert import_graph.layering_violations({source: {target}, target: set()}) == []


def test_a_module_on_no_layer_is_named(import_graph):
    found = import_graph.layering_violations({"hvdlite.newthing": set()})
    assert found == ["hvdlite.newthing is on no layer: add it to LAYERS in tools/import_graph.py"]
