"""Where a run's side files are, and the one check every file read passes: inside the logdir.

Clients name runs (as TensorBoard lists them) and opaque snapshot ids, never paths.
The server maps a run to its directory itself: through TensorBoard's multiplexer
(``--load_fast=false``, the only loader that takes ``--logdir_spec``), or as the run
name below ``--logdir`` (the Rust data server names runs by their relative path).
Every path is then resolved with ``os.path.realpath`` and must lie inside one of the
roots TensorBoard was started with; a symlink pointing outside is refused. A file is then
opened once, by :func:`open_below`: each folder below the root and the file itself with
``O_NOFOLLOW``, relative to the folder above, so a symlink swapped in after the check is
refused rather than followed, and what was opened is what is read (``fstat`` of the
descriptor says it is a regular file).

Example:
    >>> import os, tempfile
    >>> from tbmem.plugin.paths import inside
    >>> root = os.path.realpath(tempfile.mkdtemp())
    >>> inside(os.path.join(root, "a", "..", "b"), root), inside("/etc/passwd", root)
    (True, False)
"""

from __future__ import annotations

import errno
import os
import re
import stat
from typing import Any

__all__ = ["inside", "resolve_inside", "spec_paths", "RunDirs", "open_below", "open_regular_below"]

_URI = re.compile(r"[a-zA-Z][0-9a-zA-Z.]*://")


def inside(path: str, root: str) -> bool:
    """Whether ``realpath(path)`` is ``root`` or below it (``root`` already a realpath)."""
    real = os.path.realpath(path)
    try:
        return os.path.commonpath([real, root]) == root
    except ValueError:  # different drives on Windows
        return False


_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC


def open_below(root: str, path: str, flags: int = os.O_RDONLY, mode: int = 0o666, *,
               make_dirs: bool = False) -> int:
    """A descriptor of ``path`` (below ``root``), opened without following a symlink below ``root``.

    ``root`` itself may be a symlink (a logdir is the user's to place); each folder below it and
    the file are opened relative to the folder above with ``O_NOFOLLOW``, so a symlink anywhere
    below ``root``, planted or swapped in, fails with ELOOP or ENOTDIR instead of being followed.

    Args:
        root: The folder the path must stay in.
        path: The file, ``root`` joined with relative parts (no ``..``).
        flags: ``os.open`` flags of the file (``O_NOFOLLOW`` and ``O_CLOEXEC`` are added).
        mode: Permissions of a file created (the umask applies).
        make_dirs: Create missing folders below ``root``.

    Raises:
        OSError: ELOOP/ENOTDIR for a symlink below ``root``, EXDEV for a path outside it, or why
            the open failed.

    Example:
        >>> import os, tempfile
        >>> root = tempfile.mkdtemp()
        >>> fd = open_below(root, os.path.join(root, "a", "b.txt"), os.O_WRONLY | os.O_CREAT, make_dirs=True)
        >>> os.close(fd); os.symlink(os.path.join(root, "a"), os.path.join(root, "link"))
        >>> try:
        ...     open_below(root, os.path.join(root, "link", "b.txt"))
        ... except OSError as exc:
        ...     print(exc.errno in (errno.ELOOP, errno.ENOTDIR))
        True
    """
    rel = os.path.relpath(path, root)
    parts = rel.split(os.sep)
    if os.path.isabs(rel) or any(p in ("", ".", "..") for p in parts):
        raise OSError(errno.EXDEV, "not below the folder it must stay in", path)
    here = os.open(root, _DIR)
    try:
        for name in parts[:-1]:
            try:
                below = os.open(name, _DIR | _NOFOLLOW, dir_fd=here)
            except FileNotFoundError:
                if not make_dirs:
                    raise
                try:
                    os.mkdir(name, 0o777, dir_fd=here)
                except FileExistsError:
                    pass
                below = os.open(name, _DIR | _NOFOLLOW, dir_fd=here)
            os.close(here)
            here = below
        return os.open(parts[-1], flags | _NOFOLLOW | _CLOEXEC, mode, dir_fd=here)
    finally:
        os.close(here)


def open_regular_below(root: str, path: str) -> tuple[int, os.stat_result]:
    """``(descriptor, its fstat)`` of the regular file ``path``, read-only, through :func:`open_below`.

    Opened non-blocking (a FIFO planted under the name must not hang the server), then checked:
    anything but a regular file is refused with OSError.
    """
    fd = open_below(root, path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def resolve_inside(path: str, roots: list[str]) -> tuple[str, str] | None:
    """(realpath, root) for the first root that holds ``path``; None when none does."""
    real = os.path.realpath(path)
    for root in roots:
        if inside(real, root):
            return real, root
    return None


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

    def run_dir(self, run: str) -> tuple[str, str] | None:
        """(run directory realpath, its root) for a run TensorBoard lists; None if not local or outside."""
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
