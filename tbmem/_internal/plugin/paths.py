"""Where a run's side files are, and the one check every file read passes: inside the logdir.

Clients name runs (as TensorBoard lists them) and opaque snapshot ids, never paths.
The server maps a run to its directory itself: through TensorBoard's multiplexer
(``--load_fast=false``, the only loader that takes ``--logdir_spec``), or as the run
name below ``--logdir`` (the Rust data server names runs by their relative path).
Every path is then resolved with ``os.path.realpath`` and must lie inside one of the
roots TensorBoard was started with; a symlink pointing outside is refused. A file is then
opened once, by :func:`tbmem._internal.logdir.safe_open.open_below`: each folder below the root and the
file itself with ``O_NOFOLLOW``, relative to the folder above, so a symlink swapped in after the
check is refused rather than followed, and what was opened is what is read (``fstat`` of the
descriptor says it is a regular file).

Example:
    >>> from tbmem._internal.plugin.paths import spec_paths
    >>> spec_paths("a:/logs/a,/logs/b")
    ['/logs/a', '/logs/b']
"""

from __future__ import annotations

import importlib.util
import os
import re
from typing import Any

from tbmem._internal.logdir.safe_open import resolve_inside

__all__ = ["spec_paths", "RunDirs"]

_URI = re.compile(r"[a-zA-Z][0-9a-zA-Z.]*://")


def spec_paths(logdir_spec: str) -> list[str]:
    """The directories of a ``--logdir_spec`` (``name:/path,/other``), as TensorBoard splits it."""
    paths = []
    for spec in (logdir_spec or "").split(","):
        if not spec:
            continue
        if not _URI.match(spec) and ":" in spec and spec[0] != "/" and not os.path.splitdrive(spec)[0]:
            spec = spec.partition(":")[2]  # "name:path" (a Windows drive or a URI is a path)
        paths.append(spec)
    return paths


class RunDirs:
    """Maps TensorBoard run names to local run directories inside the logdir.

    Args:
        context: The plugin's ``TBContext`` (``logdir``, ``flags``, ``multiplexer``).

    Example:
        >>> import os, tempfile
        >>> from types import SimpleNamespace
        >>> logdir = os.path.realpath(tempfile.mkdtemp())
        >>> os.makedirs(f"{logdir}/exp/rank0")
        >>> dirs = RunDirs(SimpleNamespace(logdir=logdir, flags=None, multiplexer=None))
        >>> dirs.run_dir("exp/rank0")[0] == f"{logdir}/exp/rank0", dirs.run_dir("../etc")
        (True, None)
    """

    def __init__(self, context: Any) -> None:
        flags = getattr(context, "flags", None)
        self._logdir = context.logdir or getattr(flags, "logdir", "") or ""
        spec = getattr(flags, "logdir_spec", "") or ""
        raw = [self._logdir] if self._logdir else spec_paths(spec)
        self.roots = [os.path.realpath(os.path.expanduser(p)) for p in raw if p and not _URI.match(p)]
        self._multiplexer = getattr(context, "multiplexer", None)
        self._remote = None  # a remote --logdir: side files copied into a local cache (tbmem._internal.plugin.remote)
        if self._logdir and _URI.match(self._logdir) and importlib.util.find_spec("fsspec") is not None:
            from tbmem._internal.plugin.remote import RemoteRuns

            self._remote = RemoteRuns(self._logdir)

    def run_dir(self, run: str) -> tuple[str, str] | None:
        """(run directory realpath, its root) for a run TensorBoard lists; None if not local or outside."""
        if self._remote is not None:
            return self._remote.run_dir(run)
        path = None
        if self._multiplexer is not None:
            try:
                path = self._multiplexer.RunPaths().get(run)
            except Exception:  # noqa: BLE001 - a foreign multiplexer: fall back to the logdir join
                path = None
        if path is None and self._logdir:
            parts = run.split("/")
            if any(p in ("", "..") for p in parts) or os.path.isabs(run):
                return None  # run names never contain these; refuse rather than join
            path = self._logdir if run == "." else os.path.join(os.path.expanduser(self._logdir), *parts)
        if path is None or _URI.match(str(path)):
            return None
        found = resolve_inside(str(path), self.roots)
        if found is None or not os.path.isdir(found[0]):
            return None
        return found
