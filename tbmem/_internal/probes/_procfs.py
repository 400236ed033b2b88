"""/proc files kept open and read with ``pread``: a record re-reads them without opening anything.

Opening, reading and closing ``/proc/self/status`` costs about three times what a ``pread`` at
offset 0 of an already open descriptor costs (the kernel regenerates the file's contents at every
read from offset 0, so a kept descriptor never returns stale data). Descriptors are shared by every
probe of the process, opened on first use with ``O_CLOEXEC``, and forgotten in a forked child,
where ``/proc/self`` opened by the parent still names the parent.

Example:
    >>> from tbmem._internal.probes._procfs import kb_fields, pread_all
    >>> data = pread_all("/proc/self/status")
    >>> kb_fields(data, (b"VmRSS",))[b"VmRSS"] > 0
    True
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["pread_all", "write_all", "kb_fields", "forget", "close_all", "current_pid", "PAGE_SIZE"]

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_CHUNK = 8192  # /proc/self/status and /proc/meminfo are 1.5-2 KiB; larger files are read in chunks
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)

_fds: dict[tuple[str, int], int] = {}
# This process's id, kept current by forget() in a child forked through Python (os.fork,
# multiprocessing): a getpid() per read is a system call, and the first one after a training
# step costs ~4 us.
_pid = [os.getpid()]


def close_all(fds: dict[Any, int]) -> None:
    """Close every descriptor in ``fds`` (values), ignoring errors, and empty it."""
    for fd in fds.values():
        try:
            os.close(fd)
        except OSError:
            pass
    fds.clear()


def forget() -> None:
    """Close every kept descriptor (they are reopened on next use); in a forked child, whose
    ``/proc/self`` is not the one the parent opened, this runs at the fork."""
    close_all(_fds)
    _pid[0] = os.getpid()


if hasattr(os, "register_at_fork"):  # not on Windows, which has neither fork nor /proc
    os.register_at_fork(after_in_child=forget)


def current_pid() -> int:
    """``os.getpid()`` without a system call (kept current in children forked through Python)."""
    return _pid[0]


def _fd(path: str, flags: int) -> int:
    key = (path, flags)
    fd = _fds.get(key)
    if fd is None:
        fd = _fds[key] = os.open(path, flags | _CLOEXEC)
    return fd


def _drop(key: tuple[str, int]) -> None:
    fd = _fds.pop(key, None)
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass


def pread_all(path: str) -> bytes:
    """The whole current contents of ``path`` (kept open). Raises OSError like ``open`` would; a
    descriptor whose read fails is closed, so the next call opens the file again."""
    key = (path, os.O_RDONLY)
    fd = _fd(path, os.O_RDONLY)
    try:
        data = os.pread(fd, _CHUNK, 0)
        while len(data) % _CHUNK == 0 and data:  # a larger file: the rest, in order
            more = os.pread(fd, _CHUNK, len(data))
            if not more:
                break
            data += more
    except OSError:
        _drop(key)
        raise
    return data


def write_all(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` (kept open for writing). Raises OSError; the descriptor of a
    failed write is closed and reopened next time."""
    key = (path, os.O_WRONLY)
    fd = _fd(path, os.O_WRONLY)
    try:
        os.write(fd, data)
    except OSError:
        _drop(key)
        raise


def kb_fields(data: bytes, wanted: tuple[bytes, ...]) -> dict[bytes, int] | None:
    """``{field: bytes}`` for the ``kB`` lines ``field:  <n> kB`` of a /proc file's contents, or
    None when one is missing or malformed."""
    found: dict[bytes, int] = {}
    for key in wanted:
        head = key + b":"
        if data.startswith(head):
            start = len(head)
        else:
            at = data.find(b"\n" + head)
            if at < 0:
                return None
            start = at + 1 + len(head)
        end = data.find(b"\n", start)
        field = data[start:end if end >= 0 else len(data)].split()
        if len(field) != 2 or field[1] != b"kB":
            return None
        try:
            found[key] = int(field[0]) * 1024
        except ValueError:
            return None
    return found
