"""Snapshot pages rendered in a child process with a memory limit, within a budget for all of them.

What a snapshot costs to convert depends on what is in it, not only on its size: a valid
107 MiB pickle whose events carry their own frame dicts took 2.5 GiB inside the TensorBoard
server, and four first opens of one file at once took four times the memory of one. So the
server never converts a snapshot itself. :func:`render_page` starts a fresh Python
(``python -m tbmem._internal.plugin.convert``), hands it the file as the descriptor the server opened
and checked (never a path, so it reads what was checked), and reads the page from its
stdout. The child limits its own address space before it reads anything
(:func:`memory_limit`: a base plus a multiple of the file's size, at most the budget), so a
file that needs more ends in a MemoryError there, answered 413, and the server's memory
does not move; once a quarter of a pickle is read, a file bound to need far more than its
limit is given up early. Near the limit, glibc's malloc falls back to one failing system call
per small object, and a child crawled there for minutes instead of failing: a watchdog thread
ends the child with the same 413 once it sits at the limit with most of its time in the
kernel. The child also dies with the server that started it. :class:`Budget` bounds the limits
of every conversion running at once; :class:`tbmem._internal.plugin.snapshots.SnapshotPages` lets
concurrent requests for one file share one conversion and caches its page. Nothing here imports torch.

Example:
    >>> from tbmem._internal.plugin.convert import Budget, memory_limit
    >>> memory_limit(100 * 2**20, budget=4 * 2**30) // 2**20  # MiB for a 100 MiB file
    1056
    >>> budget = Budget(2**30)
    >>> budget.acquire(2**29, timeout=0), budget.acquire(2**30, timeout=0)
    (True, False)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

__all__ = ["Budget", "memory_limit", "render_page", "ConversionFailed", "MEMORY_PER_BYTE", "MEMORY_BASE",
           "DEFAULT_BUDGET_MB", "TIMEOUT_S"]

#: Address space a conversion may use per byte of the file (an 86 MiB pickle of 2 M events peaked at
#: 663 MiB: 7.7 times its size; the real snapshots of ../shared at 116-131 MiB, what the child
#: starts with; 26 MiB of events with their own frame dicts at 636 MiB: 24 times, refused).
MEMORY_PER_BYTE = 8
#: Address space of the child before it reads anything (Python and numpy take 116 MiB), plus slack.
MEMORY_BASE = 256 * 2**20
#: Default of ``--tbmem_snapshot_memory_mb``: the address space of every conversion running at once.
DEFAULT_BUDGET_MB = 4096
#: Longest a conversion may take (it is killed then; the page says how to open the file offline).
TIMEOUT_S = 300.0

_OFFLINE = "open it with `tbmem snapshot html`, which has no such limit"
#: Within this much of the limit, a child spending most of its CPU time in the kernel for
#: _CRAWL_SAMPLES samples of _CRAWL_SAMPLE_S in a row is crawling (see the module docstring).
_LIMIT_MARGIN = 8 * 2**20
_CRAWL_SAMPLE_S = 0.5
_CRAWL_SAMPLES = 4


class ConversionFailed(Exception):
    """A page could not be rendered; ``status`` is the HTTP status, the message is safe to show."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def memory_limit(size: int, *, budget: int) -> int:
    """The address space a conversion of a ``size``-byte file may use: at most ``budget``."""
    return min(budget, MEMORY_BASE + MEMORY_PER_BYTE * size)


class Budget:
    """Bytes of address space shared by the conversions that run at once.

    Args:
        total: The bytes every running conversion's limit must fit into, together.
    """

    def __init__(self, total: int) -> None:
        self.total = total
        self.in_use = 0
        self._cond = threading.Condition()

    def acquire(self, need: int, timeout: float) -> bool:
        """Take ``need`` bytes (at most :attr:`total`), waiting up to ``timeout`` s; False if they never freed."""
        need = min(need, self.total)
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.in_use + need > self.total:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            self.in_use += need
            return True

    def release(self, need: int) -> None:
        """Give back what :meth:`acquire` took."""
        with self._cond:
            self.in_use -= min(need, self.total)
            self._cond.notify_all()


def render_page(fd: int, size: int, *, name: str, step: int | None, budget: Budget,
                timeout: float = TIMEOUT_S) -> str:
    """The viewer page of the snapshot open at ``fd`` (``name``: its name in the run, for messages).

    Raises:
        ConversionFailed: 413 over the memory limit, 422 not a snapshot or a pickle naming Python
            objects, 503 no budget or time left, 500 the converter died otherwise.
    """
    limit = memory_limit(size, budget=budget.total)
    if not budget.acquire(limit, timeout):
        raise ConversionFailed(503, f"the Memory tab is converting other snapshots; try {name} again later")
    try:
        return _run_child(fd, limit, name=name, step=step, timeout=timeout)
    finally:
        budget.release(limit)


def _run_child(fd: int, limit: int, *, name: str, step: int | None, timeout: float) -> str:
    import tbmem

    root = os.path.dirname(os.path.dirname(os.path.abspath(tbmem.__file__)))
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    args = [sys.executable, "-m", "tbmem._internal.plugin.convert", str(fd), str(limit), name, "" if step is None else str(step)]
    try:
        done = subprocess.run(args, pass_fds=(fd,), capture_output=True, timeout=timeout, env=env,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ConversionFailed(503, f"converting {name} took longer than {timeout:.0f} s; {_OFFLINE}") from None
    if done.returncode == 0:
        return done.stdout.decode("utf-8")
    try:
        err = json.loads(done.stderr.decode("utf-8", "replace").strip().splitlines()[-1])
        raise ConversionFailed(int(err["status"]), str(err["message"]))
    except (ValueError, KeyError, IndexError, TypeError):
        pass
    if done.returncode < 0:  # killed (the kernel's OOM killer, a crash in a library)
        raise ConversionFailed(413, f"converting {name} ended with signal {-done.returncode}, likely for want of "
                                    f"memory; {_OFFLINE}")
    raise ConversionFailed(500, f"converting {name} failed (exit status {done.returncode})")


class _Projection:
    """While a pickle is read: give up once a quarter of it shows that the whole needs far more than
    ``limit`` (memory grows with what was read), instead of reading on until the limit is reached.

    It is called as each piece of the file is read, when everything read before was taken in: the
    memory then is that of the bytes read up to the previous call.
    """

    def __init__(self, size: int, limit: int) -> None:
        self.size, self.limit = size, limit
        self.base = _address_space()
        self.before = 0

    def __call__(self, done: int) -> None:
        taken, self.before = self.before, done
        if taken * 4 < self.size:
            return
        need = self.base + (_address_space() - self.base) * self.size / taken
        if need > 1.5 * self.limit:
            raise MemoryError(f"reading the whole file would take about {need / 2**20:.0f} MiB")


def _address_space() -> int:
    with open("/proc/self/statm", "rb") as fh:
        return int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _over_limit_message(name: str, limit: int) -> str:
    return f"{name} needs more than the {limit / 2**20:.0f} MiB of memory the Memory tab allows one snapshot; {_OFFLINE}"


def _die_with_parent() -> None:
    """Linux: the kernel kills this child when the server that started it exits."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the server's timeout still ends it


def _watch_address_space(limit: int, name: str) -> None:
    """Start a thread that ends the process with the 413 answer once it crawls at the limit.

    Sitting near the limit is normal under RLIMIT_AS (glibc's reservations fail and fall back);
    crawling is that plus the kernel's time taking over: most of the CPU time in failing system
    calls, :data:`_CRAWL_SAMPLES` samples in a row.
    """
    try:
        statm = os.open("/proc/self/statm", os.O_RDONLY)
    except OSError:
        return  # no /proc: the limit alone
    page = os.sysconf("SC_PAGE_SIZE")
    # formatted now: while crawling, even a small allocation takes failing system calls
    answer = (json.dumps({"status": 413, "message": _over_limit_message(name, limit)}) + "\n").encode()

    def watch() -> None:
        crawling = 0
        before = os.times()
        while True:
            time.sleep(_CRAWL_SAMPLE_S)
            now = os.times()
            system, total = now.system - before.system, now.system + now.user - before.system - before.user
            before = now
            near = int(os.pread(statm, 64, 0).split()[0]) * page >= limit - _LIMIT_MARGIN
            crawling = crawling + 1 if near and total > 0 and system > 0.5 * total else 0
            if crawling >= _CRAWL_SAMPLES:
                os.write(2, answer)
                os._exit(3)

    threading.Thread(target=watch, name="tbmem-address-space", daemon=True).start()


def _child(fd: int, limit: int, name: str, step: int | None) -> int:
    """In the child: limit the address space, read the snapshot from ``fd``, write its page to stdout."""
    import resource

    _die_with_parent()
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    _watch_address_space(limit, name)
    try:
        from tbmem._internal.snapshot.readers import read_snapshot
        from tbmem._internal.snapshot.safe_pickle import UnsafePickleError
        from tbmem._internal.snapshot.viewer import render_html

        try:
            progress: Any = _Projection(os.fstat(fd).st_size, limit)
        except (OSError, ValueError):
            progress = None  # no /proc: the limit alone
        with os.fdopen(fd, "rb") as fh:
            try:
                snap = read_snapshot(fh, name, progress=progress, unpickle=False)  # a logdir's file: never unpickled
            except UnsafePickleError:
                return _refuse(422, f"{name} is not plain data (it names Python objects); tbmem never runs code "
                                    "from a file, so it is not shown")
            except (ValueError, OSError, EOFError, RecursionError) as exc:
                return _refuse(422, f"{name} is not a readable memory snapshot ({type(exc).__name__}: "
                                    f"{' '.join(str(exc).split())[:300]})")
        if step is not None and not snap.step:
            snap.step = step  # a pickle cannot know it; its path (iteration_20) did
        page = render_html(snap).encode("utf-8")
    except MemoryError:
        return _refuse(413, _over_limit_message(name, limit))
    except (ValueError, RecursionError) as exc:
        return _refuse(422, f"{name} cannot be shown ({type(exc).__name__}: {' '.join(str(exc).split())[:300]})")
    sys.stdout.buffer.write(page)
    sys.stdout.buffer.flush()
    return 0


def _refuse(status: int, message: str) -> int:
    print(json.dumps({"status": status, "message": message}), file=sys.stderr)
    return 3


if __name__ == "__main__":  # python -m tbmem._internal.plugin.convert FD LIMIT NAME STEP
    sys.exit(_child(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]) if sys.argv[4] else None))
