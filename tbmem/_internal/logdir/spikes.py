"""The loss-spike side file of a run, ``plugins/tbmem/spikes.jsonl``: its writer half and its reader half.

:class:`tbmem._internal.spikes.SpikeMonitor` appends one JSON line per spike it reports (the tag, the step,
the value, its ratio to the rolling median, the snapshot written); the Memory tab marks them on its
timeline and ``tbmem report`` lists them. Both halves open the file through
:mod:`tbmem._internal.logdir.safe_open`, as the census side file is: no symlink below the run directory is
followed, a line a full disk cut short is removed, and the reader takes only regular files and
reads at most :data:`MAX_BYTES`.

Example:
    >>> import tempfile
    >>> from tbmem._internal.logdir.spikes import append_spike, read_spikes
    >>> run = tempfile.mkdtemp()
    >>> append_spike(run, {"tag": "Loss/batch", "step": 37, "value": 9.5, "ratio": 21.5})
    >>> [(s["tag"], s["step"]) for s in read_spikes(run)]
    [('Loss/batch', 37)]
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

from tbmem._internal.logdir.layout import SPIKES_LOG
from tbmem._internal.logdir.safe_open import append_line, open_below, open_regular_below

__all__ = ["SPIKES_LOG", "MAX_BYTES", "spikes_log_path", "append_spike", "read_spikes"]

#: The most of a spikes file read (a run reports at most ``SpikeConfig.max_spikes`` spikes: kilobytes).
MAX_BYTES = 16 * 2**20
_APPEND = os.O_WRONLY | os.O_CREAT | os.O_APPEND


def spikes_log_path(run_dir: str) -> str:
    """The spikes side file of a run directory."""
    return os.path.join(run_dir, SPIKES_LOG)


def append_spike(run_dir: str, record: Mapping[str, Any]) -> None:
    """Append one spike as a JSON line.

    Raises:
        OSError: the disk refused it, or a symlink is planted on the way (the caller counts it).
        ValueError: ``record`` holds a value JSON cannot write (a NaN).
    """
    line = (json.dumps(dict(record), separators=(",", ":"), allow_nan=False) + "\n").encode("utf-8")
    fd = open_below(run_dir, spikes_log_path(run_dir), _APPEND, 0o666, make_dirs=True)
    try:
        append_line(fd, line)
    finally:
        os.close(fd)


def read_spikes(run_dir: str, *, root: str | None = None) -> list[dict[str, Any]]:
    """The spikes in ``run_dir``'s side file, in order; a damaged line is skipped; none, a symlink or
    anything but a regular file: [].

    Args:
        run_dir: The run's directory.
        root: The folder no symlink below which is followed (the logdir a server serves); None: the run.
    """
    path = spikes_log_path(run_dir)
    try:
        fd, _ = open_regular_below(root or run_dir, path)
    except OSError:
        return []
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(MAX_BYTES)
    out = []
    for line in data.splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and isinstance(doc.get("step"), int) and isinstance(doc.get("tag"), str):
            out.append(doc)
    return out
