"""The settings of a run its readers need, ``plugins/tbmem/settings.jsonl``: its writer half and its reader half.

The Memory tab runs inside TensorBoard's process and ``tbmem report`` in its own: neither sees the training
process's configuration, only the logdir. So :class:`tbmem.MemoryWriter` appends, when it opens a run, one
JSON line with what changes how the run is read: its ``loss_tags`` (the patterns its configuration and the
training process's ``TBMEM_LOSS_TAGS`` added to the built-in ones, :func:`tbmem._internal.tags.loss_tags`) and the
``module_depth`` of its by-module breakdown. A run written by several writers (a resumed run, a framework's
run that tbmem writes into) has a line of each: the loss patterns of every line count, the last line's depth.
Both halves open the file through :mod:`tbmem._internal.logdir.safe_open`, as the other side files are; the reader
takes only a regular file, reads at most :data:`MAX_BYTES`, and keeps only well-formed values (the file is
untrusted: a shared logdir).

Example:
    >>> import tempfile
    >>> from tbmem._internal.logdir.settings import append_settings, read_settings
    >>> run = tempfile.mkdtemp()
    >>> append_settings(run, loss_tags=("train/ce_loss",), module_depth=2)
    >>> read_settings(run)
    RunSettings(loss_tags=('train/ce_loss',), module_depth=2)
    >>> read_settings(tempfile.mkdtemp())  # a run from before, or one no MemoryWriter wrote
    RunSettings(loss_tags=(), module_depth=None)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Sequence

from tbmem._internal.logdir.layout import SETTINGS_LOG
from tbmem._internal.logdir.safe_open import append_line, open_below, open_regular_below

__all__ = ["SETTINGS_LOG", "MAX_BYTES", "MAX_PATTERNS", "RunSettings", "settings_path", "append_settings",
           "read_settings"]

#: The most of a settings file read (a line per writer that opened the run: bytes).
MAX_BYTES = 1 << 20
#: Loss patterns kept from a file, and the longest kept (a hostile file cannot make every tag test slow).
MAX_PATTERNS, MAX_PATTERN_CHARS = 64, 200
_APPEND = os.O_WRONLY | os.O_CREAT | os.O_APPEND


@dataclass(frozen=True)
class RunSettings:
    """What a run's writers recorded for its readers.

    Attributes:
        loss_tags: Loss patterns besides the built-in ones (every writer's, in order, once each).
        module_depth: Levels of the by-module breakdown (the last writer's); None: not recorded (a run
            from before tbmem recorded it, or one no MemoryWriter wrote).
    """

    loss_tags: tuple[str, ...] = ()
    module_depth: int | None = None


def settings_path(run_dir: str) -> str:
    """The settings side file of a run directory."""
    return os.path.join(run_dir, SETTINGS_LOG)


def append_settings(run_dir: str, *, loss_tags: Sequence[str], module_depth: int) -> None:
    """Append the settings of one writer as a JSON line (``{"version": 1, "loss_tags": [...], "module_depth": n}``).

    Raises:
        OSError: the disk refused it, or a symlink is planted on the way (the caller counts it).
    """
    doc = {"version": 1, "loss_tags": list(loss_tags), "module_depth": int(module_depth)}
    line = (json.dumps(doc, separators=(",", ":")) + "\n").encode("utf-8")
    fd = open_below(run_dir, settings_path(run_dir), _APPEND, 0o666, make_dirs=True)
    try:
        append_line(fd, line)
    finally:
        os.close(fd)


def read_settings(run_dir: str, *, root: str | None = None) -> RunSettings:
    """The run's settings; a damaged line or value is skipped; no file, a symlink or anything but a regular
    file: ``RunSettings()``.

    Args:
        run_dir: The run's directory.
        root: The folder no symlink below which is followed (the logdir a server serves); None: the run.
    """
    try:
        fd, _ = open_regular_below(root or run_dir, settings_path(run_dir))
    except OSError:
        return RunSettings()
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(MAX_BYTES)
    patterns: dict[str, None] = {}
    depth: int | None = None
    for line in data.splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if not isinstance(doc, dict):
            continue
        for p in _patterns(doc.get("loss_tags")):
            if len(patterns) < MAX_PATTERNS:
                patterns.setdefault(p)
        d = doc.get("module_depth")
        if isinstance(d, int) and not isinstance(d, bool) and d >= 1:
            depth = d
    return RunSettings(loss_tags=tuple(patterns), module_depth=depth)


def _patterns(value: Any) -> list[str]:
    if not isinstance(value, list):
        return []
    return [p for p in value if isinstance(p, str) and 0 < len(p) <= MAX_PATTERN_CHARS]
