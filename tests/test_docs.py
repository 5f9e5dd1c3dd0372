"""The docs say what the code does: the knob page is generated from the knob table that
``hvdrun --help`` uses."""

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
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
