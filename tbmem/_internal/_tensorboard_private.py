"""Every use of TensorBoard's and torch's private event-file internals, in one module.

tbmem guards a SummaryWriter's event files against a full disk (:mod:`tbmem._internal._safe_io`), writes a
MemoryWriter's own records on the calling thread (:mod:`tbmem._internal._direct_events`), checksums them with
a compiled CRC (:mod:`tbmem._internal._fastcrc`) and reads event files with that CRC. Each of these reaches
into objects TensorBoard does not document: the ``FileWriter`` -> ``EventFileWriter`` ->
``_AsyncWriter`` -> ``RecordWriter`` -> ``GFile`` chain, its lock, queue and worker thread, and the
module-level CRC function of the record reader. Those names are used here only, each checked
before it is used: where TensorBoard's internals differ, a function returns None or False and the
caller keeps TensorBoard's own behaviour (tested against the tensorboard pinned in constraints.txt).

Example:
    >>> import tempfile
    >>> from torch.utils.tensorboard import SummaryWriter
    >>> from tbmem._internal import _tensorboard_private as tbp
    >>> sw = SummaryWriter(tempfile.mkdtemp())
    >>> [type(tbp.record_writer(fw)).__name__ for fw in tbp.file_writers(sw)]
    ['RecordWriter']
    >>> sw.close()
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

__all__ = ["file_writers", "default_file_writer", "async_writer", "record_writer", "replace_record_writer",
           "record_framing", "gfile_of", "local_binary", "appends_locally", "appendable", "gfile_path", "plain_file_writer",
           "direct_target", "append_now", "queue_bytes", "add_event", "use_reader_crc"]


def default_file_writer(summary_writer: Any) -> Any:
    """The default ``FileWriter`` of ``summary_writer`` (opened again by torch if it was closed)."""
    return summary_writer._get_file_writer()


def file_writers(summary_writer: Any) -> list[Any]:
    """Every ``FileWriter`` of ``summary_writer`` (``add_scalars`` opens one per tag); [] where it has none."""
    get = getattr(summary_writer, "_get_file_writer", None)
    if get is None:
        return []
    default = get()
    writers = getattr(summary_writer, "all_writers", None) or {None: default}
    return list(writers.values())


def async_writer(file_writer: Any) -> Any:
    """The ``_AsyncWriter`` behind ``file_writer`` (its queue, lock and writer thread), or None."""
    return getattr(getattr(file_writer, "event_writer", None), "_async_writer", None)


def record_writer(file_writer: Any) -> Any:
    """The record writer the writer thread of ``file_writer`` writes with, or None."""
    return getattr(async_writer(file_writer), "_writer", None)


def replace_record_writer(file_writer: Any, make: Callable[[Any, str], Any], done: type) -> bool:
    """Put ``make(record_writer, path)`` in place of ``file_writer``'s record writer, in the async writer
    and its thread, under the lock ``flush`` and ``close`` hold; True where it is (or already is, an
    instance of ``done``), False where the internals differ or the writer thread is gone."""
    event_writer = getattr(file_writer, "event_writer", None)
    aw = getattr(event_writer, "_async_writer", None)
    worker = getattr(aw, "_worker", None)
    inner = getattr(aw, "_writer", None)
    lock = getattr(aw, "_lock", None)
    if (event_writer is None or aw is None or inner is None or worker is None or lock is None
            or not hasattr(worker, "_record_writer")):
        return False
    if isinstance(inner, done):
        return True
    if getattr(worker, "exception", None) is not None or not worker.is_alive():
        return False
    path = getattr(event_writer, "_file_name", None) or str(event_writer.get_logdir())
    replacement = make(inner, path)
    with lock:  # no flush or close runs while the references change
        aw._writer = replacement
        worker._record_writer = replacement
    return True


def record_framing(inner: Any) -> Any:
    """TensorBoard's ``record_writer`` module when ``inner`` is its RecordWriter (then a record framed
    as its ``write`` frames it, written to :func:`gfile_of`, is the same bytes), else None."""
    try:
        from tensorboard.summary.writer import record_writer as module
    except ImportError:
        return None
    same = (type(inner) is module.RecordWriter and hasattr(inner, "_writer")
            and callable(getattr(module, "masked_crc32c", None)))
    return module if same else None


def gfile_of(inner: Any) -> Any:
    """The file a RecordWriter writes to (TensorBoard's ``GFile``), or None."""
    return getattr(inner, "_writer", None)


def local_binary(gfile: Any) -> bool:
    """Whether ``gfile`` is TensorBoard's GFile on a local file in binary mode, appended to per record."""
    try:
        from tensorboard.compat.tensorflow_stub.io.gfile import GFile, LocalFileSystem
    except ImportError:
        return False
    return (type(gfile) is GFile and type(gfile.fs) is LocalFileSystem and gfile.binary_mode is True
            and isinstance(gfile.filename, bytes))


def appends_locally(gfile: Any) -> bool:
    """Whether the file appends each record at once (TensorBoard without TensorFlow, a local file):
    then it ends at the last complete record."""
    return bool(getattr(gfile, "fs_supports_append", False))


def appendable(gfile: Any) -> bool:
    """Whether the GFile has written its first record and is open (then a record is appended to its path)."""
    return bool(gfile.write_started and not gfile.closed)


def gfile_path(gfile: Any) -> bytes:
    """The path a local GFile appends to."""
    return bytes(gfile.filename)


def plain_file_writer(file_writer: Any) -> bool:
    """Whether ``add_event`` of ``file_writer`` is TensorBoard's and torch's own: it sets the event's time
    and step, serialises it and hands the bytes to the asynchronous writer."""
    try:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError:
        return False
    # torch's module is loaded wherever there is a FileWriter; looked up, not imported: the readers
    # that use this module's reader CRC (tbmem._internal.logdir) run without torch
    torch_writer = sys.modules.get("torch.utils.tensorboard.writer")
    return (torch_writer is not None and type(file_writer) is getattr(torch_writer, "FileWriter", None)
            and type(getattr(file_writer, "event_writer", None)) is EventFileWriter)


def direct_target(file_writer: Any, ours: Callable[[Any], bool]) -> tuple[Any, Any]:
    """``(async writer to append to on this thread or None, async writer to queue bytes to or None)``:
    the first where its record writer passes ``ours`` and every attribute :func:`append_now` uses exists,
    the second where ``file_writer`` is TensorBoard's own."""
    aw = async_writer(file_writer)
    direct = (aw if ours(getattr(aw, "_writer", None))
              and all(hasattr(aw, a) for a in ("_lock", "_byte_queue", "_worker", "_closed")) else None)
    queue = aw if plain_file_writer(file_writer) and callable(getattr(aw, "write", None)) else None
    return direct, queue


def append_now(aw: Any, data: bytes) -> bool:
    """Write one serialised event through ``aw``'s record writer on this thread, after every event
    queued before it; False where ``aw`` is closed or its thread failed (the queued path reports it)."""
    with aw._lock:
        if aw._closed or aw._worker.exception is not None:
            return False
        # Only AsyncWriter.write queues, under aw._lock, which this holds: a count of 0 stays 0, and
        # join()'s condition (cold Python code of queue and threading, ~20 us inside a step) is skipped
        # when nothing is pending.
        if aw._byte_queue.unfinished_tasks:
            aw._byte_queue.join()
        aw._writer.write(data)
    return True


def queue_bytes(aw: Any, data: bytes) -> None:
    """Queue one serialised event for ``aw``'s writer thread (what ``FileWriter.add_event`` queues)."""
    aw.write(data)


def add_event(summary_writer: Any, event: Any, step: int) -> None:
    """``FileWriter.add_event`` on the default event file of ``summary_writer``."""
    summary_writer._get_file_writer().add_event(event, step, event.wall_time)


def use_reader_crc(crc: Callable[[bytes], int]) -> None:
    """Make TensorBoard's record *reader* check CRCs with ``crc``. TensorBoard's record writer bound
    its own CRC function when it was imported, and is imported here first: no SummaryWriter changes."""
    from tensorboard.compat.tensorflow_stub import pywrap_tensorflow
    from tensorboard.summary.writer import record_writer as _bound_first  # noqa: F401

    pywrap_tensorflow.masked_crc32c = crc
