"""Files of a logdir opened without following a symlink below it: one descriptor, checked with ``fstat``.

A logdir may be shared: a file planted under a name tbmem writes or reads (``census.jsonl``,
a snapshot) must neither make training append to someone else's file nor make a server read
one outside the logdir. :func:`open_below` opens each folder below the root and the file
itself with ``O_NOFOLLOW``, relative to the folder above, so a symlink swapped in after a
check is refused rather than followed, and what was opened is what is read or written.
The writer (:mod:`tbmem._internal.logdir.census_log`) and every reader (the Memory tab, the census
reader) open files through it.

Example:
    >>> import os, tempfile
    >>> from tbmem._internal.logdir.safe_open import inside
    >>> root = os.path.realpath(tempfile.mkdtemp())
    >>> inside(os.path.join(root, "a", "..", "b"), root), inside("/etc/passwd", root)
    (True, False)
"""

from __future__ import annotations

import errno
import os
import stat

__all__ = ["inside", "resolve_inside", "open_below", "open_regular_below", "append_line"]


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


def append_line(fd: int, line: bytes) -> None:
    """One ``write`` (concurrent appenders never interleave lines); a line the disk cut short is
    cut off again, so the next line does not continue it."""
    start = os.fstat(fd).st_size
    try:
        written = os.write(fd, line)
    except OSError:
        _cut(fd, start, 0)
        raise
    if written < len(line):
        _cut(fd, start, written)
        raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (the line was cut short after "
                                    f"{written} of {len(line)} bytes and removed)")


def _cut(fd: int, start: int, written: int) -> None:
    try:
        if written and os.fstat(fd).st_size == start + written:  # nobody appended after it
            os.ftruncate(fd, start)
    except OSError:
        pass  # the reader skips the damaged line and finds the next one behind it
