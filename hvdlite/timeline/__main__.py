"""Command line: ``python -m hvdlite.timeline summary FILE``, ``... overlap FILE`` and
``... plot FILE -o step.png``."""

from __future__ import annotations

import argparse
import sys

from .overlap import format_overlap, overlap
from .plot import MissingMatplotlib, plot_steps
from .reader import Trace
from .summary import format_summary, summarize


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hvdlite.timeline",
        description="Read an hvdlite timeline (a Chrome trace written by rank 0). "
        "A file cut off by a killed job loads too.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    text = sub.add_parser(
        "summary",
        help="per phase and per tensor: total and median time; the ranks that reported last",
    )
    text.add_argument("file")
    text.add_argument("--top", type=int, default=30, help="tensors listed (default 30)")
    hidden = sub.add_parser(
        "overlap",
        help="per training step: communication, the part hidden behind backward, the part "
        "the step waited for",
    )
    hidden.add_argument("file")
    hidden.add_argument(
        "--skip",
        type=int,
        default=1,
        help="steps left out of the total (default 1: the first negotiates every name "
        "with the coordinator)",
    )
    picture = sub.add_parser("plot", help="draw one or more steps (needs matplotlib)")
    picture.add_argument("file")
    picture.add_argument("-o", "--output", required=True, help="image file (.png, .svg, .pdf)")
    picture.add_argument(
        "--step",
        type=int,
        default=2,
        help="first step drawn, counted from 1 (default 2: the first step "
        "negotiates every name with the coordinator)",
    )
    picture.add_argument("--steps", type=int, default=1, help="steps drawn (default 1)")
    args = parser.parse_args(argv)

    try:
        trace = Trace.load(args.file)
    except (OSError, ValueError) as exc:
        print(f"hvdlite.timeline: {exc}", file=sys.stderr)
        return 1
    if args.command == "summary":
        print(format_summary(summarize(trace), top=args.top))
        return 0
    if args.command == "overlap":
        steps, outside = overlap(trace)
        print(format_overlap(steps, outside, skip=max(0, args.skip)))
        return 0
    try:
        first, last = plot_steps(trace, args.output, args.step, args.steps, title=args.file)
    except MissingMatplotlib as exc:
        print(f"hvdlite.timeline: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"hvdlite.timeline: {args.file}: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {args.output} (step {first}" + (f"-{last})" if last != first else ")"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
