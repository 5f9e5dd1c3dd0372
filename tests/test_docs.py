"""The docs say what the code does: the knob page is generated from the knob table that
``hvdrun --help`` uses, the README reads in a newcomer's order, and its elastic example
runs as printed."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
sys.path.insert(0, str(ROOT / "tools"))
import knobs_doc  # noqa: E402

sys.path.remove(str(ROOT / "tools"))

pytestmark = pytest.mark.timeout(120)


def test_the_knob_page_is_current():
    assert (ROOT / "docs" / "KNOBS.md").read_text() == knobs_doc.render(), (
        "docs/KNOBS.md is out of date: run python tools/knobs_doc.py"
    )


def test_hvdrun_help_and_the_knob_page_describe_each_knob_alike():
    from hvdlite.config import KNOBS
    from hvdlite.runner.options import KNOB_OPTIONS, build_parser

    page = (ROOT / "docs" / "KNOBS.md").read_text()
    # argparse wraps lines (also after a hyphen): compare without white space
    help_text = re.sub(r"\s+", "", build_parser().format_help())
    for opt in KNOB_OPTIONS:
        knob = opt.knob
        assert knob.help.replace("|", "\\|") in page, knob.env
        shown = opt.help.split(": ", 1)[-1] if knob.attr == "fusion_threshold" else opt.help
        assert re.sub(r"\s+", "", shown) in help_text, knob.env
    hierarchical = next(k for k in KNOBS if k.attr == "hierarchical_allreduce").help
    assert hierarchical.startswith("reduce-scatter inside each node, allreduce each shard")


def test_the_readme_reads_install_quick_start_horovod_gpu_slurm_hangs_then_reference():
    headings = re.findall(r"(?m)^## (.+)$", README)
    wanted = [
        "Install",
        "Quick start",
        "Switching from Horovod",
        "GPU tensors",
        "SLURM and several nodes",
        "My job hangs",
        "Reference",
    ]
    assert headings[: len(wanted)] == wanted


def _python_block_after(heading: str) -> str:
    section = README.split(f"\n## {heading}\n", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.timeout(180)
def test_the_readme_elastic_example_runs_as_printed(tmp_path):
    pytest.importorskip("torch")
    code = _python_block_after("Elastic training")
    assert "train(state)" in code
    script = tmp_path / "elastic_snippet.py"
    script.write_text(code + "\nprint('epochs', state.epoch)\n")
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("epochs 5")


def test_one_version_source_and_the_changelog_names_it():
    from hvdlite.version import __version__

    setup = (ROOT / "setup.cfg").read_text()
    assert "version = attr: hvdlite.version.__version__" in setup
    assert "version" not in (ROOT / "pyproject.toml").read_text().split("[tool.", 1)[0]
    releases = re.findall(r"(?m)^## \[(\d[^\]]*)\]", (ROOT / "CHANGELOG.md").read_text())
    assert releases and releases[0] == __version__, (releases, __version__)
