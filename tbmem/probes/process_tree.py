"""Process tree memory: the RSS of this process plus every process below it (DataLoader workers).

A DataLoader worker that leaks grows its own RSS, not the training process's:
``Memory/RAM/process_rss_GB`` stays flat while the machine runs out of memory.
:class:`ProcessTreeProbe` sums the RSS of this process and all its descendants
and counts the descendants.

On Linux the tree is read from ``/proc/<pid>/task/<tid>/children`` (every thread
of a process: a worker is the child of the thread that started it) and each
process's RSS from ``/proc/<pid>/statm``, about 0.1 ms for a process with two
workers. Elsewhere (or when ``children`` files are missing, kernels without
``CONFIG_PROC_CHILDREN``) psutil walks the process table, which costs a few
milliseconds.

The sum counts each process's resident pages, so pages that processes share
(copy-on-write pages a forked worker inherited and has not written, shared
libraries) count once per process: the absolute value overstates what the tree
holds, while its growth is real growth of some process in the tree.

Example:
    >>> from tbmem.probes.process_tree import ProcessTreeProbe
    >>> readings = ProcessTreeProbe().read()
    >>> readings["ram_tree_rss"] >= readings["ram_tree_workers"] >= 0
    True
"""

from __future__ import annotations

import os

from tbmem.probes.base import Probe

__all__ = ["ProcessTreeProbe", "descendants", "tree_rss"]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _children_proc(pid: int) -> list[int] | None:
    """Direct children of ``pid`` from /proc; None when the kernel does not list them."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    found: list[int] = []
    listed = False
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
                found.extend(int(c) for c in fh.read().split())
            listed = True
        except OSError:  # the thread ended meanwhile, or no CONFIG_PROC_CHILDREN
            continue
    return found if listed else None


def descendants(pid: int | None = None) -> list[int]:
    """Process ids of every descendant of ``pid`` (default: this process), parents first."""
    pid = os.getpid() if pid is None else pid
    if _children_proc(pid) is None:
        import psutil

        try:
            return [p.pid for p in psutil.Process(pid).children(recursive=True)]
        except psutil.Error:
            return []
    out: list[int] = []
    queue = [pid]
    seen = {pid}
    while queue:
        for child in _children_proc(queue.pop(0)) or ():
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


class ProcessTreeProbe(Probe):
    """Reads the summed RSS of this process and its descendants, and their number.

    Readings: ``ram_tree_rss`` (bytes) and ``ram_tree_workers`` (descendant processes).
    """

    name = "process_tree"

    def __init__(self) -> None:
        self._pid = os.getpid()

    def read(self) -> dict[str, float]:
        if os.getpid() != self._pid:  # read in a forked child: it is its own tree
            self._pid = os.getpid()
        total, workers = tree_rss(self._pid)
        return {"ram_tree_rss": float(total), "ram_tree_workers": float(workers)}
