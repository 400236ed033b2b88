"""The ``tbmem`` command line: ``tbmem snapshot ...``, ``tbmem report ...``, ``tbmem compare ...``,
``tbmem forecast ...``, ``tbmem tags``.

Each subcommand lives with the code it drives and registers itself through an
``add_parser(subparsers)`` function; this module only dispatches. Help texts are
shown without the reStructuredText markup of the docstrings they come from.

When the reader of standard output goes away early (``tbmem tags | head -5``),
every subcommand ends quietly with exit status 141, as a Unix tool killed by
SIGPIPE does (``set -o pipefail`` sees the cut-short output as in ``yes | head``);
neither a traceback nor "Broken pipe" is printed.

Example:
    >>> from tbmem._internal.cli import main
    >>> main(["tags", "--grep", "vram_allocated"])  # doctest: +ELLIPSIS
    | tag | unit | meaning | when |
    ...
    0
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from typing import Sequence

__all__ = ["main", "build_parser", "EXIT_BROKEN_PIPE", "plain_text"]

# modules that provide add_parser(subparsers) for a subcommand
_SUBCOMMANDS = ("tbmem._internal.snapshot.cli", "tbmem._internal.analysis.cli", "tbmem._internal.analysis.compare_cli", "tbmem._internal.forecast.cli",
                "tbmem._internal.analysis.trace")

#: Exit status when standard output's reader closed the pipe: 128 + SIGPIPE, what a shell reports
#: for a tool that SIGPIPE ended.
EXIT_BROKEN_PIPE = 141

_DESCRIPTION = (
    "tbmem: the memory and speed of PyTorch and PhiFlow training loops, visible in TensorBoard. "
    "These commands read what tbmem.MemoryWriter wrote: summaries and leak checks of a logdir, "
    "memory snapshots, the tag table, and forecasts of a trainer config's peak memory.")
_EPILOG = """examples:
  tbmem report runs                  peaks, census mix, step times and leaks of every run
  tbmem report runs --png r.png      the same, and a figure
  tbmem compare RUN_A RUN_B          two runs (or more) side by side with their differences
  tbmem snapshot html FILE.json.gz   the offline timeline viewer of a memory snapshot
  tbmem tags --grep vram             the TensorBoard tags tbmem writes
  tbmem COMMAND --help               the options of one command"""

_ROLES = re.compile(r":[a-z]+:`~?([^`]+)`")  # :class:`tbmem.MemoryWriter` -> tbmem.MemoryWriter
_LITERAL = re.compile(r"``([^`]+)``")


def plain_text(text: str) -> str:
    """Text of a docstring without its reStructuredText markup (``literal``, :class:`X`).

    Example:
        >>> plain_text("a ``.json.gz`` file read by :func:`tbmem.load_snapshot`")
        'a .json.gz file read by tbmem.load_snapshot'
    """
    return _LITERAL.sub(r"\1", _ROLES.sub(r"\1", text))


class _PlainFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the descriptions' line breaks and shows them, and every option's help, without markup."""

    def _format_text(self, text: str) -> str:
        return super()._format_text(plain_text(text))

    def _expand_help(self, action: argparse.Action) -> str:
        return plain_text(super()._expand_help(action))


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose subcommands' help is shown as plain text too."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        kwargs.setdefault("formatter_class", _PlainFormatter)
        if kwargs.get("description"):
            # a docstring's paragraphs, re-wrapped: RawDescription keeps line breaks, not indentation
            kwargs["description"] = "\n\n".join(
                _wrap(" ".join(p.split())) for p in str(kwargs["description"]).split("\n\n"))
        super().__init__(*args, **kwargs)


def _wrap(paragraph: str) -> str:
    import textwrap

    width = max(40, min(100, _columns()) - 2)
    return textwrap.fill(plain_text(paragraph), width=width)


def _columns() -> int:
    import shutil

    return shutil.get_terminal_size((80, 24)).columns


def _tags_command(args: argparse.Namespace) -> int:
    from tbmem._internal.tags import markdown_table

    lines = markdown_table().splitlines()
    rows = lines[2:]
    if args.grep:
        rows = [r for r in rows if args.grep.lower() in r.lower()]
    print("\n".join(lines[:2] + rows))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every available subcommand registered."""
    parser = _Parser(prog="tbmem", description=_DESCRIPTION, epilog=_EPILOG)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    tags = sub.add_parser("tags", help="print the table of TensorBoard tags tbmem writes",
                          description="Print the table of every TensorBoard tag tbmem writes: its unit, "
                                      "its meaning and which component writes it, how often.")
    tags.add_argument("--grep", help="only rows containing this text")
    tags.set_defaults(func=_tags_command)
    for module in _SUBCOMMANDS:
        try:
            importlib.import_module(module).add_parser(sub)
        except ImportError as exc:  # an optional subcommand whose extra is missing
            name = module.removeprefix("tbmem._internal.").split(".")[0]
            stub = sub.add_parser(name, help=f"(unavailable: {exc})")
            stub.set_defaults(func=lambda _a, _e=exc: _unavailable(_e))
    return parser


def _unavailable(exc: ImportError) -> int:
    print(f"tbmem: {exc}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (141 when stdout's reader went away)."""
    try:
        args = build_parser().parse_args(argv)
        status = int(args.func(args) or 0)
        sys.stdout.flush()  # inside the try: a closed pipe surfaces here, not at interpreter exit
        return status
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's final flush has nowhere to fail."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout without a file descriptor (a test's capture)
        pass


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
