"""The snapshot pages of the Memory tab: converted in a child process, memory bounded, shared and kept.

A run's snapshots are listed by :func:`tbmem._internal.logdir.snapshots.find_snapshots` (tbmem's files and
PyTorch pickles under the run, each behind an opaque id the client sends back, never a path).
A file is served from the realpath found when it was listed, opened once with ``O_NOFOLLOW``
on every component below the logdir and checked with ``fstat``
(:func:`tbmem._internal.logdir.safe_open.open_regular_below`): a symlink swapped in after the listing
is refused, never followed. Pages are rendered in a child process with a memory limit
(:mod:`tbmem._internal.plugin.convert`); requests for one file while it converts share that
conversion, and the last pages are kept. Pickles are read as plain data
(:mod:`tbmem._internal.snapshot.pickle_stream`): a file naming any Python object is refused, so
nothing in a file ever runs.

Example:
    >>> from tbmem._internal.plugin.snapshots import SnapshotError
    >>> SnapshotError(413, "too large").status
    413
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict

from tbmem._internal.logdir.safe_open import open_regular_below
from tbmem._internal.logdir.snapshots import SnapshotEntry
from tbmem._internal.plugin.convert import DEFAULT_BUDGET_MB, TIMEOUT_S, Budget, ConversionFailed, render_page

__all__ = ["SnapshotPages", "SnapshotError", "MAX_SNAPSHOT_BYTES"]

#: Larger files are not rendered in the tab (``tbmem snapshot html`` writes their page offline).
MAX_SNAPSHOT_BYTES = 1 << 30


class SnapshotError(Exception):
    """A snapshot cannot be shown; ``status`` is the HTTP status, the message is safe to show.

    Example:
        >>> SnapshotError(422, "not a snapshot").status
        422
    """

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Flight:
    """One conversion in progress, waited on by the requests for the same file that came meanwhile."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.page: str | None = None
        self.error: tuple[int, str] | None = None

    def answer(self) -> str:
        return _answer(self.page if self.page is not None else self.error)


class SnapshotPages:
    """Renders snapshot pages with the offline viewer: memory bounded, shared and kept.

    Each file is converted once however many requests ask for it at once (they wait for the
    one conversion), in a child process whose memory is limited (:mod:`tbmem._internal.plugin.convert`);
    the conversions running at once share ``budget_mb``. The last ``size`` pages, at most
    ``cache_mb`` together, and the answers for files that cannot be shown are kept, keyed by
    the file's device, inode, size and modification time.

    Example:
        >>> import os, tempfile
        >>> from tbmem._internal.snapshot.schema import SnapshotBuilder, encode_json_gz
        >>> run = os.path.realpath(tempfile.mkdtemp())
        >>> os.makedirs(f"{run}/plugins/tbmem")
        >>> b = SnapshotBuilder(source="dispatch", device="cpu")
        >>> _ = b.alloc(64, time_us=0)
        >>> with open(f"{run}/plugins/tbmem/snapshot_rank0_step000000003.json.gz", "wb") as fh:
        ...     _ = fh.write(encode_json_gz(b.build(kind="snapshot", step=3)))
        >>> from tbmem._internal.logdir.snapshots import find_snapshots
        >>> (entry,) = find_snapshots(run, run)
        >>> SnapshotPages().page(entry, run).startswith("<!DOCTYPE html>")
        True
    """

    def __init__(self, size: int = 4, *, cache_mb: int = 256, budget_mb: int = DEFAULT_BUDGET_MB,
                 timeout_s: float = TIMEOUT_S) -> None:
        self._size = size
        self._cache_bytes = cache_mb * 2**20
        self._budget = Budget(budget_mb * 2**20)
        self._timeout = timeout_s
        self._pages: OrderedDict[tuple[int, int, int, int], str | tuple[int, str]] = OrderedDict()
        self._flights: dict[tuple[int, int, int, int], _Flight] = {}
        self._lock = threading.Lock()

    def page(self, entry: SnapshotEntry, root: str) -> str:
        """The viewer page for ``entry``, a file listed below ``root``.

        Raises:
            SnapshotError: 404 no longer a regular file there (a symlink now, say), 413 too large
                or over the memory limit, 422 not a snapshot or a pickle naming Python objects,
                503 busy or too slow.
        """
        try:
            fd, st = open_regular_below(root, entry.path)
        except OSError:
            raise SnapshotError(404, f"{entry.name} is no longer a file of the run") from None
        try:
            key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            with self._lock:
                kept = self._pages.get(key)
                if kept is not None:
                    self._pages.move_to_end(key)
                    flight, mine = None, False
                else:
                    flight = self._flights.get(key)
                    mine = flight is None
                    if mine:
                        flight = self._flights[key] = _Flight()
            if kept is not None:
                return _answer(kept)
            assert flight is not None
            if not mine:
                flight.done.wait()
                return flight.answer()
            try:
                flight.page = self._convert(fd, st, entry)
            except SnapshotError as exc:
                flight.error = (exc.status, str(exc))
            finally:
                with self._lock:
                    self._keep(key, flight)
                    del self._flights[key]
                flight.done.set()
            return flight.answer()
        finally:
            os.close(fd)

    def _convert(self, fd: int, st: os.stat_result, entry: SnapshotEntry) -> str:
        if st.st_size > MAX_SNAPSHOT_BYTES:
            raise SnapshotError(413, f"{entry.name} is {st.st_size / 2**30:.1f} GiB; open it offline with "
                                     f"`tbmem snapshot html`")
        try:
            return render_page(fd, st.st_size, name=entry.name, step=entry.step if entry.format == "pickle" else None,
                               budget=self._budget, timeout=self._timeout)
        except ConversionFailed as exc:
            raise SnapshotError(exc.status, str(exc)) from None

    def _keep(self, key: tuple[int, int, int, int], flight: _Flight) -> None:
        if flight.page is None and (flight.error is None or flight.error[0] in (500, 503)):
            return  # busy, too slow or a crash: tried again next time
        self._pages[key] = flight.page if flight.page is not None else flight.error  # type: ignore[assignment]
        kept = sum(len(v) for v in self._pages.values() if isinstance(v, str))
        while len(self._pages) > self._size or (len(self._pages) > 1 and kept > self._cache_bytes):
            _, dropped = self._pages.popitem(last=False)
            kept -= len(dropped) if isinstance(dropped, str) else 0


def _answer(kept: str | tuple[int, str] | None) -> str:
    if isinstance(kept, tuple):
        raise SnapshotError(*kept)
    if kept is None:
        raise SnapshotError(500, "the snapshot could not be converted")
    return kept
