"""``tbmem compare RUN_A RUN_B [RUN ...]``: runs side by side with their differences (``--json``, ``--png``).

Each argument is a run folder (one that holds event files, or a folder holding exactly one run).
Runs are named by their path below the folder the arguments share and shown as columns A, B, ...;
each later run's difference from A follows, with its sign. Exit status: 0 fine, 2 the runs cannot
be compared (missing, no memory tags, a folder with several runs, damaged event files, a missing
extra). Errors are one line on stderr.

Example:
    >>> from tbmem._internal.cli import main
    >>> main(["compare", "/nonexistent/a", "/nonexistent/b"])
    2
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Sequence

from tbmem._internal._extras import MissingExtraError

__all__ = ["add_parser", "compare_command", "load_runs", "format_comparison"]

EXIT_ERROR = 2


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``compare`` on the ``tbmem`` command line's subparsers."""
    p = subparsers.add_parser(
        "compare", help="runs side by side: peaks, step time, census cost, the census at aligned points",
        description="Compare two or more runs: peak VRAM/RAM, step time, census cost, L-BFGS-B iterations and "
                    "the census by category, module and dtype at aligned points (the same steps, or for runs of "
                    "different lengths the start, middle and end of each), with each run's difference from "
                    f"the first. Exit status: 0 ok, {EXIT_ERROR} cannot compare.")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run folders (two or more)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--png", metavar="FILE", help="write a figure: the runs' memory on shared axes, their census "
                                                 "by category at the aligned points, their step times")
    p.add_argument("--align", choices=("auto", "step", "phase"), default="auto",
                   help="align by step (runs of the same steps) or by phase (start, middle, end of each run); "
                        "auto: step when the runs recorded the same steps (default)")
    p.add_argument("--allow-truncated", action="store_true",
                   help="compare the readable part of truncated or corrupt event files instead of stopping")
    p.set_defaults(func=compare_command)
    return p


def _fail(message: str) -> int:
    from tbmem._internal._terminal import printable_lines

    print(f"tbmem compare: {printable_lines(message)}", file=sys.stderr)
    return EXIT_ERROR


def compare_command(args: argparse.Namespace) -> int:
    """Run ``tbmem compare``; returns the exit status."""
    from tbmem._internal.analysis.cli import _finite, _os_error
    from tbmem._internal.analysis.load import AnalysisError

    try:
        if len(args.runs) < 2:
            return _fail("name two or more runs")
        from tbmem._internal.analysis.compare import compare

        df, names = load_runs(args.runs, on_error="warn" if args.allow_truncated else "raise")
        result = compare(df, names, align=args.align)
        if args.json:
            doc = dict(result.to_dict(), paths=dict(zip(names, args.runs)))
            print(json.dumps(_finite(doc), indent=2, allow_nan=False))
        else:
            from tbmem._internal._terminal import printable_lines

            print(printable_lines(format_comparison(result)))  # run and module names come from files
        if args.png:
            from tbmem._internal.analysis.compare_plot import plot_comparison

            sys.stdout.flush()
            plot_comparison(df, result, path=args.png)
            if not args.json:
                print(f"\nfigure written to {args.png}")
        return 0
    except (AnalysisError, MissingExtraError, ValueError) as exc:
        return _fail(str(exc))
    except BrokenPipeError:
        raise
    except OSError as exc:
        return _fail(_os_error(exc))


def load_runs(paths: Sequence[str], *, on_error: str = "raise") -> tuple[Any, list[str]]:
    """The scalars of each run folder in one frame, each run named by its path below the folder the
    paths share; and the names in order."""
    from tbmem._internal._extras import require
    from tbmem._internal.analysis.load import AnalysisError, find_runs, load_scalars

    pd = require("pandas", extra="analysis")

    real = [os.path.abspath(p) for p in paths]
    if len(set(real)) < len(real):
        raise AnalysisError("a run is named twice")
    base = os.path.commonpath(real) if len(real) > 1 else os.path.dirname(real[0])
    names = [os.path.relpath(p, base) if p != base else os.path.basename(p) for p in real]
    frames = []
    for path, name in zip(paths, names):
        found = find_runs(path)
        if len(found) > 1:
            raise AnalysisError(f"{path!r} holds {len(found)} runs ({', '.join(sorted(found)[:4])}"
                                f"{', ...' if len(found) > 4 else ''}): name one of them")
        df = load_scalars(path, on_error=on_error)
        frames.append(df.assign(run=name))
    return pd.concat(frames, ignore_index=True), names


def format_comparison(c: Any) -> str:
    """The comparison as a plain-text table: a legend naming A, B, ..., then one row per metric."""
    from tbmem._internal.analysis.table import _diff, _render, format_value

    labels = c.labels
    lines = [f"{lab}  {run}" for lab, run in zip(labels, c.runs)]
    if c.align == "phase":
        lines.append("aligned by phase: the census nearest to the start, middle and end of each run's censuses "
                     "(the runs' lengths differ)")
    else:
        lines.append("aligned by step: the first, middle and last census step the runs share")
    header = ["metric", *labels, *[f"{lab}-{labels[0]}" for lab in labels[1:]]]
    body: list[list[str]] = []
    section = None
    for row in c.rows:
        if row.section != section:
            section = row.section
            body.append([section] + [""] * (len(header) - 1))
        cells = [f"  {row.metric}"] + [format_value(v, row.kind) for v in row.values]
        for v in row.values[1:]:
            a = row.values[0]
            numeric = row.kind != "text" and isinstance(a, (int, float)) and isinstance(v, (int, float))
            cells.append(_diff(a, v, row.kind) if numeric else "")
        body.append(cells)
    return "\n".join(lines) + "\n\n" + "\n".join(_render([header], body))
