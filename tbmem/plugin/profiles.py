"""The Memory tab's profile windows: each window's offline summary, and its trace to download.

A run's windows are its ``plugins/tbmem/traces/step<s>/rank<r>.pt.trace.json.gz`` files (listed by name)
(:func:`tbmem.logdir.traces.list_traces`); the client names a window by its file name, which must
match :data:`tbmem.logdir.traces.TRACE_FILE` and be listed, and every file is opened below the
logdir without following a symlink (:func:`tbmem.logdir.traces.read_trace`). The summary is what
the window wrote into its trace's ``"tbmem"`` key (the step time split, torch.profiler's
``key_averages()`` top operators, the memory tracks): shown without the network. Perfetto
(``ui.perfetto.dev``, which TensorBoard's content policy lets a page frame) needs the network.

Example:
    >>> import tempfile
    >>> from tbmem.plugin.profiles import list_windows
    >>> list_windows((tempfile.mkdtemp(), "/"))
    []
"""

from __future__ import annotations

import os
from typing import Any

from tbmem.logdir.safe_open import open_regular_below
from tbmem.logdir.traces import MAX_BYTES, TRACE_FILE, list_traces, read_trace, trace_path

__all__ = ["list_windows", "window_summary", "trace_file", "ProfileError"]


class ProfileError(Exception):
    """A window cannot be shown; ``status`` is the HTTP status, the message is safe to show.

    Example:
        >>> ProfileError(404, "unknown profile window").status
        404
    """

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def list_windows(found: tuple[str, str]) -> list[dict[str, Any]]:
    """The run's profile windows: ``{"name", "rank", "step", "bytes"}`` each, by step then rank."""
    return list_traces(found[0])


def _listed(found: tuple[str, str], name: str) -> None:
    if not TRACE_FILE.match(name or "") or not any(t["name"] == name for t in list_traces(found[0])):
        raise ProfileError(404, "unknown profile window")


def window_summary(found: tuple[str, str], name: str) -> dict[str, Any]:
    """The offline summary of window ``name``: its steps, clock, step time split, top operators, tracks."""
    _listed(found, name)
    try:
        doc = read_trace(found[0], name, root=found[1])
    except OSError as exc:
        raise ProfileError(413 if "larger" in str(exc) or "inflates" in str(exc) else 404,
                           f"cannot read {name}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ProfileError(422, str(exc)) from None
    meta = doc.get("tbmem")
    if not isinstance(meta, dict) or not isinstance(meta.get("summary"), dict):
        raise ProfileError(422, f"{name} has no tbmem summary (not a profile window's trace)")
    return {"name": name, "rank": meta.get("rank"), "first_step": meta.get("first_step"),
            "last_step": meta.get("last_step"), "clock": meta.get("clock"), "summary": meta["summary"]}


def trace_file(found: tuple[str, str], name: str) -> bytes:
    """The gzip'd bytes of window ``name``'s trace, as written (for the download and Perfetto)."""
    _listed(found, name)
    try:
        fd, st = open_regular_below(found[1], trace_path(found[0], name))
    except OSError as exc:
        raise ProfileError(404, f"cannot open {name}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as fh:
        if st.st_size > MAX_BYTES:
            raise ProfileError(413, f"{name} is larger than {MAX_BYTES >> 20} MB")
        return fh.read(MAX_BYTES)
