"""``tbmem snapshot html FILE -o OUT [--torch]`` and ``tbmem snapshot stats FILE``.

FILE is a tbmem ``.json.gz`` snapshot or a PyTorch pickle (``.pickle``), read
as plain data: a pickle that names any Python object is refused, so no code
from the file runs.

Example:
    >>> import argparse
    >>> from tbmem.snapshot.cli import add_parser
    >>> sub = argparse.ArgumentParser(prog="tbmem").add_subparsers(dest="command")
    >>> add_parser(sub).prog
    'tbmem snapshot'
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys

__all__ = ["add_parser", "html_command", "stats_command"]

_PICKLE_WARNING = ("FILE may be a PyTorch .pickle snapshot: it is read as plain data, and a pickle that names "
                   "any Python object is refused, so no code from the file runs.")


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``snapshot`` with its ``html`` and ``stats`` subcommands."""
    parser = subparsers.add_parser("snapshot", help="view and summarise memory snapshots",
                                   description=__doc__.split("\n\n")[1])
    sub = parser.add_subparsers(dest="snapshot_command", required=True, metavar="SUBCOMMAND")
    html = sub.add_parser("html", help="write the offline timeline viewer for a snapshot",
                          description="Write one self-contained HTML file (no network access). " + _PICKLE_WARNING)
    html.add_argument("file", metavar="FILE", help="snapshot .json.gz (or a torch .pickle)")
    html.add_argument("-o", "--output", required=True, metavar="OUT", help="HTML file to write")
    html.add_argument("--torch", action="store_true",
                      help="write PyTorch's own trace_plot instead (needs a torch .pickle; that page "
                           "loads its viewer from a CDN, so it needs network access)")
    html.set_defaults(func=html_command)
    stats = sub.add_parser("stats", help="top allocations by size, stack frame and category",
                           description="Print a summary of a snapshot. " + _PICKLE_WARNING)
    stats.add_argument("file", metavar="FILE", help="snapshot .json.gz (or a torch .pickle)")
    stats.add_argument("--top", type=int, default=10, help="rows per table (default 10)")
    stats.set_defaults(func=stats_command)
    return parser


def _fail(message: str) -> int:
    print(f"tbmem snapshot: {message}", file=sys.stderr)
    return 2


def html_command(args: argparse.Namespace) -> int:
    """``tbmem snapshot html``."""
    from tbmem import _torch_private as tp
    from tbmem.snapshot.readers import is_pickle_path, load_snapshot, load_torch_pickle
    from tbmem.snapshot.viewer import render_html

    try:
        if args.torch:
            if not is_pickle_path(args.file):
                return _fail("--torch needs a torch .pickle snapshot (tbmem .json.gz files have no torch form)")
            page = tp.memory_viz_trace_plot(load_torch_pickle(args.file))
            if page is None:
                return _fail("this torch has no torch.cuda._memory_viz.trace_plot")
        else:
            page = render_html(load_snapshot(args.file))
    except (OSError, ValueError, EOFError, pickle.UnpicklingError) as exc:
        return _fail(f"cannot read {args.file}: {exc}")
    out = os.fspath(args.output)
    with open(out, "w", encoding="utf-8") as fh:
        fh.write(page)
    print(out)
    return 0


def stats_command(args: argparse.Namespace) -> int:
    """``tbmem snapshot stats``."""
    from tbmem.snapshot.readers import load_snapshot, snapshot_stats

    try:
        snap = load_snapshot(args.file)
    except (OSError, ValueError, EOFError, pickle.UnpicklingError) as exc:
        return _fail(f"cannot read {args.file}: {exc}")
    print(snapshot_stats(snap, top=max(1, args.top)))
    return 0
