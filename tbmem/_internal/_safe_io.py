"""Event files that survive a full or read-only disk: drop, count, retry, never raise.

TensorBoard's ``EventFileWriter`` writes records from a background thread. When a
write fails (``ENOSPC``, ``EROFS``, ``EIO``) that thread stores the exception and dies,
and from then on *every* ``add_scalar`` and ``flush`` of the training loop raises it:
a full log disk ends the run. :func:`install` puts a :class:`SafeRecordWriter` in
front of the writer thread's record writer, where the error first surfaces:

- a failed write is undone (the file is truncated back to its last complete
  record, so everything written before stays readable), the event is dropped and
  counted, and the thread lives on;
- while writing fails, events are dropped and counted without touching the disk,
  and a write is retried with exponential backoff (1 s doubling to 60 s), so the
  run recovers by itself when space returns;
- one warning per cause (errno and filesystem) names the path; the count is
  reported at close by :meth:`FaultLedger.report_close`.

The same :class:`FaultLedger` counts the snapshots a writer could not write, so a
full disk gives one line however many components hit it.

Example:
    >>> import tempfile
    >>> from torch.utils.tensorboard import SummaryWriter
    >>> from tbmem._internal._safe_io import FaultLedger, install
    >>> logdir = tempfile.mkdtemp()
    >>> sw = SummaryWriter(logdir); ledger = FaultLedger(logdir)
    >>> install(sw, ledger)
    True
    >>> sw.add_scalar("x", 1.0, 0); sw.close(); ledger.dropped_events
    0
"""

from __future__ import annotations

import os
import struct
import threading
from typing import Any, Callable

from tbmem._internal import _tensorboard_private as tbp
from tbmem._internal._log import logger, report_once
from tbmem._internal._retry import Backoff

__all__ = ["FaultLedger", "SafeRecordWriter", "install", "hold_events", "cause_key", "describe"]

_RECORD_FRAMING = 16  # TFRecord: u64 length, u32 length CRC, the data, u32 data CRC
_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")
# what io.open(path, "ab") opens with, which TensorBoard's LocalFileSystem.append calls per record
_APPEND = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)

def _device_of(path: str) -> int | None:
    """``st_dev`` of ``path`` or of its nearest existing ancestor."""
    p = os.path.abspath(path)
    while True:
        try:
            return os.stat(p).st_dev
        except OSError:
            parent = os.path.dirname(p)
            if parent == p:
                return None
            p = parent


def cause_key(path: str, exc: BaseException) -> str:
    """One key per cause: the error number on one filesystem (a full disk is one cause)."""
    code = getattr(exc, "errno", None)
    return f"io:{code if code is not None else type(exc).__name__}:{_device_of(path)}"


def describe(exc: BaseException) -> str:
    """``strerror [Errno N]`` for an OSError, else ``Type: message``."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror} [Errno {exc.errno}]"
    return f"{type(exc).__name__}: {exc}"


class FaultLedger:
    """What one writer could not write to disk, and the one line per cause that says so.

    Args:
        log_dir: The writer's log directory (named in the summary at close).
    """

    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir
        self.dropped_events = 0
        self.dropped_snapshots = 0
        self.dropped_census_lines = 0
        self.last_error: str | None = None
        self._lock = threading.Lock()

    def failed(self, path: str, exc: BaseException, *, events: int = 0, snapshots: int = 0,
               census_lines: int = 0) -> bool:
        """Count what ``exc`` cost; log the cause the first time it is seen. Returns whether logged."""
        with self._lock:
            self.dropped_events += events
            self.dropped_snapshots += snapshots
            self.dropped_census_lines += census_lines
            self.last_error = describe(exc)
        return report_once(
            cause_key(path, exc),
            f"tbmem: cannot write to {path}: {describe(exc)}; training continues: TensorBoard events and "
            "snapshots that cannot be written are dropped and counted (reported at close) and "
            "writing is retried until it works again")

    def dropped(self, *, events: int = 0, snapshots: int = 0) -> None:
        """Count what was dropped without trying (while waiting for the next retry)."""
        with self._lock:
            self.dropped_events += events
            self.dropped_snapshots += snapshots

    def recovered(self, path: str) -> None:
        """Writing works again (logged at INFO: the count comes at close)."""
        logger.info("tbmem: writing to %s works again (%d events dropped so far)", path, self.dropped_events)

    def summary(self) -> str | None:
        """The line :meth:`report_close` logs, or None when nothing was lost."""
        if not (self.dropped_events or self.dropped_snapshots or self.dropped_census_lines):
            return None
        parts = []
        if self.dropped_events:
            parts.append(f"{self.dropped_events} TensorBoard event{'s' if self.dropped_events != 1 else ''}")
        if self.dropped_snapshots:
            parts.append(f"{self.dropped_snapshots} memory snapshot{'s' if self.dropped_snapshots != 1 else ''}")
        if self.dropped_census_lines:
            n = self.dropped_census_lines
            parts.append(f"{n} census record{'s' if n != 1 else ''} of the Memory tab")
        return (f"tbmem: {' and '.join(parts)} could not be written to {self.log_dir} "
                f"({self.last_error}) and {'were' if len(parts) > 1 or self._only_count() != 1 else 'was'} "
                "dropped; everything else was written")

    def _only_count(self) -> int:
        return self.dropped_events + self.dropped_snapshots + self.dropped_census_lines

    def report_close(self) -> None:
        """Log the summary once, at close."""
        line = self.summary()
        if line is not None:
            logger.warning("%s", line)


class SafeRecordWriter:
    """Stands in for TensorBoard's ``RecordWriter`` inside its writer thread; never raises.

    Args:
        inner: The ``RecordWriter`` it wraps.
        path: The event file (local files are truncated back after a partial write).
        ledger: Where drops are counted and causes reported.
        backoff: Retry schedule while writing fails.
    """

    def __init__(self, inner: Any, path: str, ledger: FaultLedger, backoff: Backoff | None = None, *,
                 crc: Callable[[bytes], int] | None = None) -> None:
        self._inner = inner
        self.path = path
        self._ledger = ledger
        self._backoff = backoff or Backoff(base_s=1.0, cap_s=60.0)
        # Only TensorBoard's own writer (no TensorFlow) appends each record to the file at once;
        # then the file ends at the last complete record, whose end is tracked here (a stat per
        # record would cost more than the rest of this wrapper).
        gfile = tbp.gfile_of(inner)
        local = tbp.appends_locally(gfile) and os.path.isfile(path)
        self._end = _size(path) if local else None
        self.failing = False
        # TensorBoard's RecordWriter module where this frames the same bytes itself, with ``crc``
        # (this file's own: tbmem._internal._fastcrc, bit-identical) or else TensorBoard's
        framing = tbp.record_framing(inner)
        self._crc: Callable[[bytes], int] | None = None
        if framing is not None:
            self._crc = crc if crc is not None else framing.masked_crc32c
        self._framing = framing if local and tbp.local_binary(gfile) else None
        self._gfile = gfile if self._framing is not None else None
        self._append_to = tbp.gfile_path(gfile) if self._gfile is not None else b""
        self._file = gfile if framing is not None else None  # what RecordWriter.write writes to
        self._hold_bytes = 0  # see hold()
        self._held = bytearray()
        self._held_records = 0

    def write(self, data: bytes) -> None:
        """Write one record, or drop and count it while the disk refuses writes."""
        if self.failing and not self._backoff.ready():
            self._ledger.dropped(events=1)
            return
        try:
            gfile = self._gfile
            if gfile is not None and tbp.appendable(gfile):
                if self._hold_bytes:
                    self._held += _frame(data, self._crc)
                    self._held_records += 1
                    if len(self._held) >= self._hold_bytes:
                        self.write_held()
                    return
                _append(self._append_to, _frame(data, self._crc))
            elif self._file is not None:  # RecordWriter.write's bytes, with this file's CRC
                self._file.write(_frame(data, self._crc))
            else:
                self._inner.write(data)
        except Exception as exc:  # noqa: BLE001 - this thread dying would break every later write
            if self._end is not None:
                _truncate(self.path, self._end)
            self.failing = True
            self._backoff.failed()
            self._ledger.failed(self.path, exc, events=1)
            return
        if self._end is not None:
            self._end += len(data) + _RECORD_FRAMING
        self._recovered()

    def _recovered(self) -> None:
        if self.failing:
            self.failing = False
            self._backoff.succeeded()
            self._ledger.recovered(self.path)

    def hold(self, limit_bytes: int) -> None:
        """Append records in batches of about ``limit_bytes`` (and at :meth:`close`) instead of one by one.

        For event files nobody reads while they are written: the private run of a rank in the
        compact layout (:mod:`tbmem._internal.ranks.compact`), moved into the job or deleted at close. A
        record appended at once costs three system calls, about as much as its encoding.
        Only where each record is appended by this writer (:attr:`local`).
        """
        if self._framing is not None:
            self._hold_bytes = max(0, int(limit_bytes))

    def write_held(self) -> None:
        """Append the records :meth:`hold` keeps; a failure drops and counts them."""
        if not self._held or self._end is None or self._gfile is None:
            return
        records, count = bytes(self._held), self._held_records
        self._held.clear()
        self._held_records = 0
        try:
            _append(self._append_to, records)
        except Exception as exc:  # noqa: BLE001 - as in write()
            _truncate(self.path, self._end)
            self.failing = True
            self._backoff.failed()
            self._ledger.failed(self.path, exc, events=count)
            return
        self._end += len(records)
        self._recovered()

    def flush(self) -> None:
        """Flush the file; a failure is counted as the writes it lost are (held records stay held)."""
        try:
            self._inner.flush()
        except Exception as exc:  # noqa: BLE001
            self._ledger.failed(self.path, exc)

    def close(self) -> None:
        """Write what is held, close the file; never raises."""
        try:
            self.write_held()
            self._inner.close()
        except Exception as exc:  # noqa: BLE001
            self._ledger.failed(self.path, exc)

    @property
    def local(self) -> bool:
        """Whether each record is appended to a local file at once (nothing left for a flush)."""
        return self._end is not None

    @property
    def closed(self) -> bool:
        """Whether the wrapped file is closed."""
        return bool(getattr(self._inner, "closed", False))


def _frame(data: bytes, crc: Any) -> bytes:
    """One TFRecord as TensorBoard's RecordWriter frames it, checksummed by ``crc`` (bit-identical
    to TensorBoard's masked CRC32C)."""
    length = _LENGTH.pack(len(data))
    return length + _CRC.pack(crc(length)) + data + _CRC.pack(crc(data))


def _append(path: bytes, record: bytes) -> None:
    """Append ``record`` to ``path`` and close it, as TensorBoard's ``LocalFileSystem.append`` does.

    Opened and closed per record like there (a kept descriptor would keep the logdir's mount busy:
    it could not be remounted read-only while training runs), with the three system calls the
    work needs: ``io.open`` also creates two file objects and asks ``fstat``, ``ioctl`` and
    ``lseek``, which made an appended record cost about 150 us inside a training step.
    """
    fd = os.open(path, _APPEND, 0o666)
    try:
        view = memoryview(record)
        while view:
            written = os.write(fd, view)
            if written <= 0:  # never for a regular file; no endless loop if it ever happens
                raise OSError(5, "Input/output error: a write appended nothing", os.fsdecode(path))
            view = view[written:]
    finally:
        os.close(fd)


def _size(path: str) -> int | None:
    try:
        return os.stat(path).st_size
    except OSError:
        return None


def _truncate(path: str, size: int) -> None:
    # Cut a partly written record: appending after it would make the rest of the file unreadable.
    try:
        actual = _size(path)
        if actual is not None and actual > size:
            os.truncate(path, size)
    except OSError as exc:
        report_once(f"truncate:{path}", f"tbmem: could not cut a partly written record from {path} "
                    f"({describe(exc)}); TensorBoard reads the file up to that record")


def install(summary_writer: Any, ledger: FaultLedger, *, fast_crc: bool = False) -> bool:
    """Guard every event file of ``summary_writer``; False where TensorBoard's internals differ.

    Where they differ (:func:`tbmem._internal._tensorboard_private.replace_record_writer`) the writer keeps
    TensorBoard's behaviour and :class:`tbmem.MemoryWriter` still catches the errors on the
    training thread. With ``fast_crc`` these files' records are checksummed by
    :func:`tbmem._internal._fastcrc.masked_crc32c` (where it is compiled): TensorBoard's own CRC function,
    which every other SummaryWriter of the process uses, is left as it is.
    """
    crc = None
    if fast_crc:
        from tbmem._internal import _fastcrc

        crc = _fastcrc.masked_crc32c if _fastcrc.available() else None
    writers = tbp.file_writers(summary_writer)
    ok = bool(writers)
    for fw in writers:
        ok = tbp.replace_record_writer(
            fw, lambda inner, path: SafeRecordWriter(inner, path, ledger, crc=crc), SafeRecordWriter) and ok
    return ok


def hold_events(summary_writer: Any, limit_bytes: int) -> int:
    """:meth:`SafeRecordWriter.hold` on every guarded event file of ``summary_writer``; how many."""
    held = 0
    for fw in tbp.file_writers(summary_writer):
        safe = tbp.record_writer(fw)
        if isinstance(safe, SafeRecordWriter) and safe.local:
            safe.hold(limit_bytes)
            held += 1
    return held
