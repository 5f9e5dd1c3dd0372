"""The import graph of hvdlite's modules (tools/import_graph.py): no cycle, no import
across the layers the wrong way, and the checker finds both."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parent.parent


def test_no_import_cycles_or_layering_violations_among_hvdlites_modules():
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "import_graph.py")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_cycle_finder_finds_a_cycle_hidden_in_a_function(tmp_path):
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import import_graph
    finally:
        sys.path.remove(str(ROOT / "tools"))
    package = tmp_path / "hvdlite"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from . import b\n")
    (package / "b.py").write_text("def f():\n    from .a import x\n")
    (package / "c.py").write_text("import hvdlite.a\n")
    assert import_graph.cycles(import_graph.graph(tmp_path)) == [["hvdlite.a", "hvdlite.b"]]


def test_the_layering_check_names_an_adapter_that_imports_the_engine(tmp_path):
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import import_graph
    finally:
        sys.path.remove(str(ROOT / "tools"))
    for package in ("hvdlite", "hvdlite/engine", "hvdlite/torch"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "hvdlite/collectives.py").write_text("from .engine import runtime\n")
    (tmp_path / "hvdlite/engine/runtime.py").write_text("")
    (tmp_path / "hvdlite/engine/cycle.py").write_text("from .. import collectives\n")
    (tmp_path / "hvdlite/torch/optimizer.py").write_text(
        "def f():\n    from hvdlite.engine import runtime\n"
    )
    found = import_graph.layering_violations(import_graph.graph(tmp_path))
    assert len(found) == 2
    assert found[0].startswith("hvdlite.engine.cycle imports hvdlite.collectives")
    assert found[1].startswith("hvdlite.torch.optimizer imports hvdlite.engine.runtime")
