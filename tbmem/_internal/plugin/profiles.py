"""The Memory tab's profile windows: each window's offline summary, and its trace to download.

A run's windows are its ``plugins/tbmem/traces/step<s>/rank<r>.pt.trace.json.gz`` files (listed by name)
(:func:`tbmem._internal.logdir.traces.list_traces`); the client names a window by its file name, which must
match :data:`tbmem._internal.logdir.traces.TRACE_FILE` and be listed, and every file is opened below the
logdir without following a symlink (:func:`tbmem._internal.logdir.traces.read_trace`). The summary is what
the window wrote into its trace's ``"tbmem"`` key (the step time split, torch.profiler's
``key_averages()`` top operators, the memory tracks): shown without the network. A trace is
untrusted (a shared logdir; 0.2 MB of gzip inflates to 200 MB of JSON, or nests 200,000 deep), so
the server never parses one itself: a fresh Python with an address-space limit of
:data:`TRACE_MEMORY` reads it from the descriptor the server opened and answers the summary
(413 over the limit, 422 not a trace), one child at a time; the answer is kept per file (name,
size, time) and concurrent requests share one child. Perfetto
(``ui.perfetto.dev``, which TensorBoard's content policy lets a page frame) needs the network.

Example:
    >>> import tempfile
    >>> from tbmem._internal.plugin.profiles import list_windows
    >>> list_windows((tempfile.mkdtemp(), "/"))
    []
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from typing import Any

from tbmem._internal.logdir.safe_open import open_regular_below
from tbmem._internal.logdir.traces import (
    MAX_BYTES,
    TRACE_FILE,
    list_traces,
    read_trace_fd,
    trace_path,
)

__all__ = ["list_windows", "window_summary", "trace_file", "ProfileError", "TRACE_MEMORY"]

#: The address space of the child that reads one trace for its summary.
TRACE_MEMORY = 1024 * 2**20
_TIMEOUT_S = 120.0
_ONE_AT_A_TIME = threading.Lock()  # one trace child at a time; waiting requests take its cached answer
_ANSWERS: dict[tuple[str, int, int], dict[str, Any] | ProfileError] = {}


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
        fd, st = open_regular_below(found[1], trace_path(found[0], name))
    except OSError as exc:
        raise ProfileError(404, f"cannot open {name}: {exc.strerror or exc}") from None
    try:
        key = (trace_path(found[0], name), st.st_size, st.st_mtime_ns)
        with _ONE_AT_A_TIME:
            answer = _ANSWERS.get(key)
            if answer is None:
                try:
                    answer = _summary_in_child(fd, name)
                except ProfileError as exc:
                    answer = exc
                if len(_ANSWERS) > 256:
                    _ANSWERS.clear()
                _ANSWERS[key] = answer
    finally:
        os.close(fd)
    if isinstance(answer, ProfileError):
        raise answer
    return answer


def _summary_in_child(fd: int, name: str) -> dict[str, Any]:
    import tbmem

    root = os.path.dirname(os.path.dirname(os.path.abspath(tbmem.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    try:
        done = subprocess.run([sys.executable, "-m", "tbmem._internal.plugin.profiles", str(fd), name], pass_fds=(fd,), check=False,
                              capture_output=True, timeout=_TIMEOUT_S, env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ProfileError(503, f"reading {name} took longer than {_TIMEOUT_S:.0f} s") from None
    try:
        answer = json.loads(done.stdout)
        if done.returncode == 0 and isinstance(answer, dict):
            if "error" in answer:
                raise ProfileError(int(answer["status"]), str(answer["error"]))
            return answer
    except (ValueError, KeyError, TypeError):
        pass
    raise ProfileError(413, f"reading {name} needs more than the {TRACE_MEMORY >> 20} MiB the Memory tab allows "
                            f"one trace (the child ended with status {done.returncode}); download it instead")


def _child(fd: int, name: str) -> dict[str, Any]:
    """In the child: limit the address space, read the trace at ``fd``, answer its summary (or an error)."""
    import resource

    from tbmem._internal.plugin.convert import _die_with_parent

    _die_with_parent()
    resource.setrlimit(resource.RLIMIT_AS, (TRACE_MEMORY, TRACE_MEMORY))
    try:
        doc = read_trace_fd(fd, name)
    except OSError as exc:
        return {"status": 413 if "larger" in str(exc) or "inflates" in str(exc) else 404,
                "error": f"cannot read {name}: {exc.strerror or exc}"}
    except MemoryError:
        return {"status": 413, "error": f"reading {name} needs more than the {TRACE_MEMORY >> 20} MiB the Memory "
                                        "tab allows one trace; download it instead"}
    except (ValueError, RecursionError) as exc:
        return {"status": 422, "error": f"{name} is not a readable trace ({type(exc).__name__}: "
                                        f"{' '.join(str(exc).split())[:200]})"}
    meta = doc.get("tbmem")
    if not isinstance(meta, dict) or not isinstance(meta.get("summary"), dict):
        return {"status": 422, "error": f"{name} has no tbmem summary (not a profile window's trace)"}
    wrong = _wrong_shape(meta["summary"])
    if wrong:
        return {"status": 422, "error": f"{name}'s tbmem summary has the wrong shape ({wrong})"}
    return {"name": name, "rank": meta.get("rank"), "first_step": meta.get("first_step"),
            "last_step": meta.get("last_step"), "clock": meta.get("clock"), "summary": meta["summary"]}


def _wrong_shape(summary: dict[str, Any]) -> str:
    """What in a summary the tab cannot draw (a planted or foreign trace), or ``""``."""
    if not isinstance(summary.get("steps"), list) or not all(isinstance(s, dict) for s in summary["steps"]):
        return "steps is not a list of steps"
    if not isinstance(summary.get("total_us"), (int, float)) or isinstance(summary["total_us"], bool):
        return "total_us is not a number"
    ops = summary.get("operators")
    if not isinstance(ops, dict) or not all(isinstance(ops.get(k), list) for k in ("by_self_time", "by_bytes")):
        return "operators lacks the lists by_self_time and by_bytes"
    return ""


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


if __name__ == "__main__":  # python -m tbmem._internal.plugin.profiles FD NAME: the summary as JSON on stdout
    print(json.dumps(_child(int(sys.argv[1]), sys.argv[2]), allow_nan=False))
