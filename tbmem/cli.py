"""The ``tbmem`` command line: ``tbmem snapshot ...``, ``tbmem report ...``, ``tbmem forecast ...``, ``tbmem tags``.

Each subcommand lives with the code it drives and registers itself through an
``add_parser(subparsers)`` function; this module only dispatches.

Example:
    >>> from tbmem.cli import main
    >>> main(["tags", "--grep", "vram_allocated"])  # doctest: +ELLIPSIS
    | tag | unit | meaning | when |
    ...
    0
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

__all__ = ["main", "build_parser"]

# modules that provide add_parser(subparsers) for a subcommand
_SUBCOMMANDS = ("tbmem.snapshot.cli", "tbmem.analysis.cli", "tbmem.forecast.cli")


def _tags_command(args: argparse.Namespace) -> int:
    from tbmem.tags import markdown_table

    lines = markdown_table().splitlines()
    rows = lines[2:]
    if args.grep:
        rows = [r for r in rows if args.grep.lower() in r.lower()]
    print("\n".join(lines[:2] + rows))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every available subcommand registered."""
    parser = argparse.ArgumentParser(prog="tbmem", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    tags = sub.add_parser("tags", help="print the table of TensorBoard tags tbmem writes")
    tags.add_argument("--grep", help="only rows containing this text")
    tags.set_defaults(func=_tags_command)
    for module in _SUBCOMMANDS:
        try:
            importlib.import_module(module).add_parser(sub)
        except ImportError as exc:  # an optional subcommand whose extra is missing
            name = module.split(".")[1]
            stub = sub.add_parser(name, help=f"(unavailable: {exc})")
            stub.set_defaults(func=lambda _a, _e=exc: _unavailable(_e))
    return parser


def _unavailable(exc: ImportError) -> int:
    print(f"tbmem: {exc}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
