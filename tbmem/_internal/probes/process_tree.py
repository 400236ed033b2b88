"""Process tree memory: the RSS of this process plus every process below it (DataLoader workers).

A DataLoader worker that leaks grows its own RSS, not the training process's:
``Memory/RAM/process_rss_GB`` stays flat while the machine runs out of memory.
:class:`ProcessTreeProbe` sums the RSS of this process and all its descendants
and counts the descendants.

On Linux the tree is read from ``/proc/<pid>/task/<tid>/children`` (every thread
of a process: a worker is the child of the thread that started it) and each
process's RSS from ``/proc/<pid>/statm``. Elsewhere (or when ``children`` files
are missing, kernels without ``CONFIG_PROC_CHILDREN``) psutil walks the process
table, which costs a few milliseconds.

What :class:`ProcessTreeProbe` reads how often (a record happens every ``every``
steps, so this is inside the training loop):

- at every read, the RSS of this process and of every known descendant, from
  their ``statm`` files kept open (``pread``, a few microseconds each). A
  descendant that has ended fails that read and is dropped at once, never
  counted with an old value (an open ``/proc/<pid>`` file of an ended process
  stays invalid even when its pid is reused);
- at every read, the ``children`` file of the calling thread (the training
  loop, which starts DataLoader workers): when it lists other processes than
  at the previous read, the tree is walked again now;
- the whole tree (every thread of every process in it) at most once per
  :attr:`ProcessTreeProbe.REFRESH_S` (1 s) otherwise. A process started by
  another thread, or by a worker, is therefore counted from the next walk, at
  most a second after it started.

The sum counts each process's resident pages, so pages that processes share
(copy-on-write pages a forked worker inherited and has not written, shared
libraries) count once per process: the absolute value overstates what the tree
holds, while its growth is real growth of some process in the tree.

Example:
    >>> from tbmem._internal.probes.process_tree import ProcessTreeProbe
    >>> readings = ProcessTreeProbe().read()
    >>> readings["ram_tree_rss"] >= readings["ram_tree_workers"] >= 0
    True
"""

from __future__ import annotations

import os
import threading
import time
import weakref

from tbmem._internal.probes._procfs import PAGE_SIZE, close_all, current_pid
from tbmem._internal.probes.base import Probe

__all__ = ["ProcessTreeProbe", "descendants", "tree_rss"]

_PAGE = PAGE_SIZE
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def _children_proc(pid: int) -> list[int] | None:
    """Direct children of ``pid`` from /proc; None when the kernel does not list them."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    found: list[int] = []
    listed = False
    for tid in tids:
        # os.open/os.read, not open(): a walk reads one file per thread of every process in the tree
        try:
            fd = os.open(f"/proc/{pid}/task/{tid}/children", os.O_RDONLY | _CLOEXEC)
        except OSError:  # the thread ended meanwhile, or no CONFIG_PROC_CHILDREN
            continue
        try:
            data = b""
            while True:
                chunk = os.read(fd, 4096)
                if not chunk:
                    break
                data += chunk
        except OSError:
            continue
        finally:
            os.close(fd)
        found.extend(int(c) for c in data.split())
        listed = True
    return found if listed else None


def descendants(pid: int | None = None, *, children: list[int] | None = None) -> list[int]:
    """Process ids of every descendant of ``pid`` (default: this process), parents first.

    ``children``: ``pid``'s direct children from /proc, when the caller has just listed them.
    """
    pid = os.getpid() if pid is None else pid
    first = children if children is not None else _children_proc(pid)
    if first is None:
        import psutil

        try:
            return [p.pid for p in psutil.Process(pid).children(recursive=True)]
        except psutil.Error:
            return []
    out: list[int] = []
    queue = [pid]
    seen = {pid}
    while queue:
        parent = queue.pop(0)
        for child in (first if parent == pid else _children_proc(parent)) or ():
            if child not in seen:  # guards against a pid reused while walking
                seen.add(child)
                out.append(child)
                queue.append(child)
    return out


def _rss(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/statm", "rb") as fh:
            return int(fh.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        pass
    try:
        import psutil

        return int(psutil.Process(pid).memory_info().rss)
    except Exception:  # noqa: BLE001 - the process ended: it holds nothing any more
        return None


def tree_rss(pid: int | None = None) -> tuple[int, int]:
    """``(bytes, processes)``: summed RSS of ``pid`` and its live descendants, and how many
    descendants were counted (a process that exits while being read is not counted)."""
    pid = os.getpid() if pid is None else pid
    total = _rss(pid) or 0
    counted = 0
    for child in descendants(pid):
        rss = _rss(child)
        if rss is not None:
            total += rss
            counted += 1
    return total, counted


def _open(path: str) -> int | None:
    try:
        return os.open(path, os.O_RDONLY | _CLOEXEC)
    except OSError:
        return None


def _statm_rss(fd: int) -> int | None:
    """Resident bytes from an open ``statm`` file; None when its process has ended."""
    try:
        return int(os.pread(fd, 128, 0).split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return None


class ProcessTreeProbe(Probe):
    """Reads the summed RSS of this process and its descendants, and their number.

    Readings: ``ram_tree_rss`` (bytes) and ``ram_tree_workers`` (descendant processes).
    What is read how often is in the module's docstring.
    """

    name = "process_tree"
    #: Longest time between two walks of the whole process tree, in seconds.
    REFRESH_S = 1.0

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._statm: dict[int, int] = {}  # pid (this one and known descendants) -> open statm
        self._children: dict[int, int] = {}  # native thread id -> its open children file
        self._last_children: dict[int, bytes] = {}
        self._walked_at = float("-inf")
        self._fast = True  # /proc readable; else tree_rss() (psutil) at every read
        # the descriptors are closed with the probe, also when it is dropped without stop()
        self._finalizer = weakref.finalize(self, close_all, self._statm)
        self._finalizer_children = weakref.finalize(self, close_all, self._children)

    def read(self) -> dict[str, float]:
        if current_pid() != self._pid:  # read in a forked child: it is its own tree
            self.stop()
            self._pid = current_pid()
        if not self._fast:
            total, workers = tree_rss(self._pid)
            return {"ram_tree_rss": float(total), "ram_tree_workers": float(workers)}
        now = time.monotonic()
        changed = self._children_changed()  # always: it keeps the thread's last listing current
        if changed or now - self._walked_at >= self.REFRESH_S:
            self._walk(now)
            if not self._fast:
                return self.read()
        total = 0
        workers = 0
        for pid, fd in list(self._statm.items()):
            rss = _statm_rss(fd)
            if rss is None:  # ended (or never readable): not counted, and forgotten
                os.close(fd)
                del self._statm[pid]
                continue
            total += rss
            workers += pid != self._pid
        return {"ram_tree_rss": float(total), "ram_tree_workers": float(workers)}

    def _children_changed(self) -> bool:
        """Whether the calling thread's children differ from its previous read."""
        tid = threading.get_native_id()
        fd = self._children.get(tid)
        if fd is None:
            fd = _open(f"/proc/{self._pid}/task/{tid}/children")
            if fd is None:
                return False
            self._children[tid] = fd
        try:
            listed = os.pread(fd, 4096, 0)
        except OSError:  # that thread ended
            os.close(self._children.pop(tid))
            self._last_children.pop(tid, None)
            return False
        before = self._last_children.get(tid)
        self._last_children[tid] = listed
        return before is not None and listed != before

    def _walk(self, now: float) -> None:
        self._walked_at = now
        children = _children_proc(self._pid)
        if children is None:  # no children files here: psutil from now on
            self._fast = False
            self.stop()
            return
        wanted = [self._pid, *descendants(self._pid, children=children)]
        for pid in set(self._statm) - set(wanted):
            os.close(self._statm.pop(pid))
        for pid in wanted:
            if pid not in self._statm:
                fd = _open(f"/proc/{pid}/statm")
                if fd is not None:
                    self._statm[pid] = fd

    def stop(self) -> None:
        """Close the kept files (they are opened again by the next read)."""
        close_all(self._statm)
        close_all(self._children)
        self._last_children.clear()
        self._walked_at = float("-inf")
