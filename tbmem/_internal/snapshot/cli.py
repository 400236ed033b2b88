"""``tbmem snapshot html FILE... [-o OUT]``, ``tbmem snapshot stats FILE [--json]``, ``tbmem snapshot diff A B``,
``tbmem snapshot export --torch FILE -o OUT.pickle`` and ``tbmem snapshot build-recorder``.

FILE is a tbmem ``.json.gz`` snapshot or a PyTorch pickle (``.pickle``), read as plain data:
a pickle that names any Python object is refused, so no code from the file runs. A file that
cannot be read (missing, truncated, malformed, over the reader's limits; a directory, a FIFO,
a device) ends the command with one line on stderr saying why (for a directory, followed by
the snapshot files in it), and exit status 2. Names from the file are printed with their
control characters escaped.

Example:
    >>> import argparse
    >>> from tbmem._internal.snapshot.cli import add_parser
    >>> sub = argparse.ArgumentParser(prog="tbmem").add_subparsers(dest="command")
    >>> add_parser(sub).prog
    'tbmem snapshot'
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
from typing import Any

__all__ = ["add_parser", "default_output", "html_command", "stats_command", "diff_command", "export_command",
           "build_recorder_command"]

_PICKLE_WARNING = ("FILE may be a PyTorch .pickle snapshot: it is read as plain data, and a pickle that names "
                   "any Python object is refused, so no code from the file runs.")


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``snapshot`` with its ``html``, ``stats``, ``diff``, ``export`` and ``build-recorder`` subcommands."""
    parser = subparsers.add_parser("snapshot", help="view and summarise memory snapshots",
                                   description=__doc__.split("\n\n")[1])
    sub = parser.add_subparsers(dest="snapshot_command", required=True, metavar="SUBCOMMAND")
    html = sub.add_parser("html", help="write the offline viewer for one or several snapshots",
                          description="Write one self-contained HTML file (no network access) showing every "
                          "device of every FILE (several: ranks of one step, or before and after, selectable "
                          "and comparable in the page). " + _PICKLE_WARNING)
    html.add_argument("file", metavar="FILE", nargs="+", help="snapshot .json.gz (or a torch .pickle)")
    html.add_argument("-o", "--output", metavar="OUT",
                      help="HTML file to write (default: the first FILE with its .json.gz, .json or .pickle "
                           "ending replaced by .html, beside it; with several FILEs, _and_N_more.html)")
    html.add_argument("--device", metavar="DEV", help="device shown first (cuda:1 or 1; default: the device "
                      "with an out-of-memory error, else the largest peak)")
    html.add_argument("--torch", action="store_true",
                      help="write PyTorch's own trace_plot instead (needs a torch .pickle; that page "
                           "loads its viewer from a CDN, so it needs network access)")
    html.set_defaults(func=html_command)
    stats = sub.add_parser("stats", help="per device: peak, OOMs, top allocations, frames, categories",
                           description="Print a summary of a snapshot, every device. " + _PICKLE_WARNING)
    stats.add_argument("file", metavar="FILE", help="snapshot .json.gz (or a torch .pickle)")
    stats.add_argument("--top", type=int, default=10, help="rows per table (default 10)")
    stats.add_argument("--device", metavar="DEV", help="only this device (cuda:1 or 1)")
    stats.add_argument("--json", action="store_true", help="one JSON object (schema in docs/snapshots.md)")
    stats.add_argument("--cpp", action="store_true",
                       help="when a stack has no user frame, name its innermost frame even if C++")
    stats.set_defaults(func=stats_command)
    diff = sub.add_parser("diff", help="what is alive in B and not in A, by allocation site and category",
                          description="Compare two snapshots (two steps of one run, two ranks): per device, the "
                          "bytes alive in B minus those in A for each allocation site and category, largest "
                          "growth first, and how much of B was allocated since A. " + _PICKLE_WARNING)
    diff.add_argument("a", metavar="A", help="the earlier snapshot (.json.gz or torch .pickle)")
    diff.add_argument("b", metavar="B", help="the later snapshot")
    diff.add_argument("--top", type=int, default=20, help="rows per table (default 20)")
    diff.add_argument("--device", metavar="DEV", help="only this device (cuda:1 or 1)")
    diff.add_argument("--at", choices=("end", "peak"), default="end",
                      help="compare what is alive when each snapshot was taken (default) or at each one's peak")
    diff.add_argument("--json", action="store_true", help="one JSON object (schema in docs/snapshots.md)")
    diff.set_defaults(func=diff_command)
    export = sub.add_parser("export", help="write a snapshot in PyTorch's own format (memory_viz opens it)",
                            description="Write FILE (any snapshot tbmem reads: a CPU run's .json.gz too) as the "
                            "pickle torch.cuda.memory._snapshot() gives: torch.cuda._memory_viz's trace_plot, "
                            "segment_plot and stats and pytorch.org/memory_viz open it. Plain data, pickle "
                            "protocol 4 (no GLOBAL or REDUCE opcode). " + _PICKLE_WARNING)
    export.add_argument("--torch", action="store_true", required=True, help="PyTorch's _snapshot() format")
    export.add_argument("file", metavar="FILE", help="snapshot .json.gz (or a torch .pickle)")
    export.add_argument("-o", "--output", required=True, metavar="OUT", help="the .pickle to write")
    export.set_defaults(func=export_command)
    build = sub.add_parser("build-recorder", help="compile the CPU snapshots' allocation recorder now",
                           description="Compile the CPU allocation recorder (C++, against the installed torch's "
                           "headers, about 4 s) into tbmem's cache ($TBMEM_CACHE_DIR, else $XDG_CACHE_HOME/tbmem, "
                           "else ~/.cache/tbmem) now rather than at the first CPU snapshot. Where it cannot be "
                           "built (no C++ compiler, no torch headers) it says why and exits with status 1; CPU "
                           "snapshots then use the slower dispatch-mode recorder.")
    build.set_defaults(func=build_recorder_command)
    return parser


def build_recorder_command(args: argparse.Namespace) -> int:
    """``tbmem snapshot build-recorder``: build the CPU recorder; 1 (with the reason) where it cannot be."""
    from tbmem._internal.snapshot import native

    return native.main()


def default_output(path: str) -> str:
    """Where ``html`` writes when no ``-o`` is given: FILE's name with ``.html`` for its snapshot ending.

    Example:
        >>> default_output("runs/x/oom_step000006.json.gz"), default_output("rank0.pickle")
        ('runs/x/oom_step000006.html', 'rank0.html')
    """
    for ending in (".json.gz", ".json", ".pickle", ".pkl", ".pt", ".gz"):
        if path.lower().endswith(ending) and len(path) > len(ending):
            return path[: -len(ending)] + ".html"
    return path + ".html"


def _fail(message: str) -> int:
    print(f"tbmem snapshot: {message}", file=sys.stderr)
    return 2


def _load(path: str) -> Any:
    """The snapshot, or an error line (str) saying why it cannot be read."""
    from tbmem._internal._terminal import printable
    from tbmem._internal.snapshot.cli_input import open_input
    from tbmem._internal.snapshot.readers import read_snapshot

    fh = open_input(path)
    if isinstance(fh, str):
        return fh
    try:
        with fh:
            return read_snapshot(fh, path)
    except MemoryError:
        return f"cannot read {printable(path)}: not enough memory"
    except (OSError, ValueError, EOFError, pickle.UnpicklingError, UnicodeDecodeError, RecursionError) as exc:
        text = printable(" ".join(str(exc).split()) or type(exc).__name__)
        name = printable(path)
        return text if text.startswith(f"{name} ") else f"cannot read {name}: {text}"


def html_command(args: argparse.Namespace) -> int:
    """``tbmem snapshot html``."""
    files = [args.file] if isinstance(args.file, str) else list(args.file)
    if args.torch:
        if len(files) > 1:
            return _fail("--torch writes one snapshot's page; give one FILE")
        args.file = files[0]
        return _torch_html(args)
    from tbmem._internal.snapshot.viewer import render_html

    snaps = []
    for path in files:
        snap = _load(path)
        if isinstance(snap, str):
            return _fail(snap)
        snaps.append(snap)
    try:
        page = render_html(snaps if len(snaps) > 1 else snaps[0], device=args.device,
                           names=[os.path.basename(f) for f in files])
    except ValueError as exc:
        return _fail(str(exc))
    return _write_page(page, args, files)


def _write_page(page: str, args: argparse.Namespace, files: list[str] | None = None) -> int:
    """Write the page to ``-o`` (default: beside FILE) and print where, or fail with one line."""
    files = files or [args.file]
    out = os.fspath(args.output) if args.output else default_output(files[0])
    if not args.output and len(files) > 1:
        out = f"{out[:-5]}_and_{len(files) - 1}_more.html"
    try:
        with open(out, "w", encoding="utf-8") as fh:
            fh.write(page)
    except OSError as exc:
        return _fail(f"cannot write {out}: {exc.strerror or exc}")
    print(out)
    return 0


def _torch_html(args: argparse.Namespace) -> int:
    from tbmem._internal import _torch_private as tp
    from tbmem._internal.snapshot.readers import is_pickle_path, load_torch_pickle

    from tbmem._internal._terminal import printable
    from tbmem._internal.snapshot.cli_input import open_input

    if not is_pickle_path(args.file):
        return _fail("--torch needs a torch .pickle snapshot (tbmem .json.gz files have no torch form)")
    fh = open_input(args.file)
    if isinstance(fh, str):
        return _fail(fh)
    try:
        with fh:
            page = tp.memory_viz_trace_plot(load_torch_pickle(fh))
    except RecursionError:
        return _fail(f"cannot render {printable(args.file)}: it is nested too deeply to be a snapshot")
    except (OSError, ValueError, EOFError, pickle.UnpicklingError, MemoryError) as exc:
        return _fail(f"cannot read {printable(args.file)}: {printable(' '.join(str(exc).split()))}")
    if page is None:
        return _fail("this torch has no torch.cuda._memory_viz.trace_plot")
    return _write_page(page, args)


def export_command(args: argparse.Namespace) -> int:
    """``tbmem snapshot export --torch``."""
    from tbmem._internal.snapshot.torch_format import dumps_plain, torch_snapshot

    snap = _load(args.file)
    if isinstance(snap, str):
        return _fail(snap)
    try:
        data = dumps_plain(torch_snapshot(snap))
        with open(args.output, "wb") as fh:
            fh.write(data)
    except OSError as exc:
        return _fail(f"cannot write {args.output}: {exc.strerror or exc}")
    print(args.output)
    return 0


def diff_command(args: argparse.Namespace) -> int:
    """``tbmem snapshot diff``."""
    from tbmem._internal.snapshot.diff import diff_doc, diff_text

    snaps = []
    for path in (args.a, args.b):
        snap = _load(path)
        if isinstance(snap, str):
            return _fail(snap)
        snaps.append(snap)
    try:
        if args.json:
            print(json.dumps(diff_doc(snaps[0], snaps[1], top=max(1, args.top), device=args.device, at=args.at)))
        else:
            print(diff_text(snaps[0], snaps[1], top=max(1, args.top), device=args.device, at=args.at,
                            names=(args.a, args.b)))
    except ValueError as exc:
        return _fail(str(exc))
    return 0


def stats_command(args: argparse.Namespace) -> int:
    """``tbmem snapshot stats``."""
    from tbmem._internal.snapshot.stats import stats_doc, stats_text

    snap = _load(args.file)
    if isinstance(snap, str):
        return _fail(snap)
    try:
        if args.json:
            print(json.dumps(stats_doc(snap, top=max(1, args.top), device=args.device)))
        else:
            from tbmem._internal._terminal import printable_lines
            from tbmem._internal.snapshot.cli_input import for_terminal

            print(printable_lines(stats_text(for_terminal(snap), top=max(1, args.top), device=args.device,
                                             cpp=args.cpp)))
    except ValueError as exc:
        return _fail(str(exc))
    return 0
