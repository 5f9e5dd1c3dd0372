"""The docs say what the code does: the knob page is generated from the knob table that
``hvdrun --help`` uses, the README is a short front page that links every page of the site
(mkdocs.yml's nav, which holds every page in docs/), and the examples of the README and of
the elastic page run as printed. ``make docs`` checks the links and anchors themselves."""

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


def test_the_readme_is_a_front_page_that_links_every_page_of_the_site():
    assert len(README.splitlines()) < 250
    headings = re.findall(r"(?m)^## (.+)$", README)
    assert headings == [
        "Install",
        "Quick start",
        "Example",
        "Across hosts: which knob when",
        "When a rank or a host fails",
        "Documentation",
    ]
    linked = set(re.findall(r"\]\((docs/[^)#]+\.md)", README))
    for path in linked:
        assert (ROOT / path).is_file(), f"README links {path}, which does not exist"
    nav = re.findall(r"(?m)^\s+- [^:]+: (\S+\.md)$", (ROOT / "mkdocs.yml").read_text())
    assert "index.md" in nav
    missing = {f"docs/{page}" for page in nav if page != "index.md"} - linked
    assert not missing, f"pages in mkdocs.yml's nav that the README does not link: {missing}"


def test_every_page_in_docs_is_in_the_sites_nav():
    nav = set(re.findall(r"(?m)^\s+- [^:]+: (\S+\.md)$", (ROOT / "mkdocs.yml").read_text()))
    pages = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert pages == nav, f"only in docs/: {pages - nav}; only in the nav: {nav - pages}"


def _python_block(text: str, after: str = "") -> str:
    section = text.split(after, 1)[1] if after else text
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def _run_snippet(tmp_path, code: str) -> subprocess.CompletedProcess:
    script = tmp_path / "snippet.py"
    script.write_text(code)
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=150,
    )


@pytest.mark.timeout(180)
def test_the_readme_example_runs_as_printed(tmp_path):
    pytest.importorskip("torch")
    code = _python_block(README, "\n## Example\n")
    assert len(code.splitlines()) <= 15
    result = _run_snippet(tmp_path, code + "print('steps', step + 1)\n")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("steps 100")


@pytest.mark.timeout(180)
def test_the_elastic_pages_example_runs_as_printed(tmp_path):
    pytest.importorskip("torch")
    code = _python_block((ROOT / "docs" / "elastic.md").read_text())
    assert "train(state)" in code
    result = _run_snippet(tmp_path, code + "\nprint('epochs', state.epoch)\n")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("epochs 5")


def test_one_version_source_and_the_changelog_names_it():
    from hvdlite.version import __version__

    setup = (ROOT / "setup.cfg").read_text()
    assert "version = attr: hvdlite.version.__version__" in setup
    assert "version" not in (ROOT / "pyproject.toml").read_text().split("[tool.", 1)[0]
    releases = re.findall(r"(?m)^## \[(\d[^\]]*)\]", (ROOT / "CHANGELOG.md").read_text())
    assert releases and releases[0] == __version__, (releases, __version__)
