"""Write a MemoryWriter's own events on the calling thread instead of through TensorBoard's queue.

A record is flushed as soon as it is written (``flush_each_record``). Through TensorBoard's
asynchronous writer that costs two thread switches per record: the event is queued, the writer
thread is woken to checksum and append it, and the training thread waits in ``flush`` until it has.
On a busy machine the wait is most of a record's cost. An event that is only queued costs the
training thread about as much again later: the writer thread, woken, takes the GIL from it.
With ``flush_each_record`` every event of :meth:`tbmem.MemoryWriter.write_scalars` (records,
monitors, census scalars) is therefore written by :class:`DirectEvents`, which does what the
writer thread would do, on the calling thread, under the same lock that ``flush`` holds:

1. take the asynchronous writer's lock (no other thread can queue an event meanwhile);
2. wait until the queue is empty, so events queued before (``add_scalar`` calls) are written first;
3. hand the record to the same record writer the writer thread uses: tbmem's
   :class:`~tbmem._internal._safe_io.SafeRecordWriter`, which appends it to the event file, never raises, and
   drops and counts it while the disk refuses writes.

The file holds the same bytes in the same order as through the queue. It is used only where that
is certain: the record writer is tbmem's guarded one on a local file (each record is appended and
the file closed at once, so a flush has nothing left to do) and TensorBoard's internals are the
ones this was written against; anywhere else :meth:`DirectEvents.write` returns False and the
caller queues the event as before.

Events are encoded by :func:`encode_event`: the bytes protobuf writes for an ``Event`` of
``simple_value`` scalars, at a fraction of the cost of building the message.
:meth:`DirectEvents.queue` hands such bytes to the writer thread where records are not flushed
at once.

Example:
    >>> import tempfile
    >>> from torch.utils.tensorboard import SummaryWriter
    >>> from tbmem._internal._direct_events import DirectEvents
    >>> from tbmem._internal._safe_io import FaultLedger, install
    >>> logdir = tempfile.mkdtemp()
    >>> sw = SummaryWriter(logdir); _ = install(sw, FaultLedger(logdir))
    >>> DirectEvents(sw).write({"Loss/train": 0.5}, step=1)
    True
    >>> sw.close()
"""

from __future__ import annotations

import struct
import time
from typing import Any, Mapping

from tensorboard.compat.proto.event_pb2 import Event

from tbmem._internal import _tensorboard_private as tbp
from tbmem._internal._safe_io import SafeRecordWriter

__all__ = ["DirectEvents", "make_event", "encode_event"]

_DOUBLE = struct.Struct("<d")
_FLOAT = struct.Struct("<f")
_INT64 = 1 << 63
_MAX_CACHED_TAGS = 4096
# tag -> the bytes of its Summary.Value up to the float: a record writes the same tags every time
_value_heads: dict[str, bytes] = {}


def make_event(values: Mapping[str, float], step: int, walltime: float | None = None) -> Event:
    """One event holding one ``Summary`` with a ``simple_value`` per tag (what ``add_summary`` writes)."""
    event = Event(wall_time=time.time() if walltime is None else walltime, step=int(step))
    add = event.summary.value.add
    for tag, value in values.items():
        add(tag=tag, simple_value=float(value))
    return event


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _value_head(tag: str) -> bytes:
    head = _value_heads.get(tag)
    if head is None:
        name = tag.encode("utf-8")
        # Summary.value (field 1) holding Value{tag (field 1), simple_value (field 2, a float)}
        body = (b"\x0a" + _varint(len(name)) + name if name else b"") + b"\x15"
        head = b"\x0a" + _varint(len(body) + 4) + body
        if len(_value_heads) < _MAX_CACHED_TAGS:
            _value_heads[tag] = head
    return head


def encode_event(values: Mapping[str, float], step: int, walltime: float | None = None) -> bytes:
    """``make_event(values, step, walltime).SerializeToString()``, at a fraction of its cost.

    The protobuf wire format of an ``Event`` holding one ``Summary`` of ``simple_value``s is
    short and fixed (fields in number order, as protobuf writes them); tests compare the bytes
    with protobuf's for random tags, values and steps. Where protobuf does something this does
    not spell out (a float32 overflow, a zero wall time, a step outside int64), protobuf
    encodes the event.
    """
    wall = time.time() if walltime is None else float(walltime)
    step = int(step)
    try:
        if not wall or not -_INT64 <= step < _INT64:
            raise OverflowError
        heads, pack = _value_heads, _FLOAT.pack
        summary = b"".join([(heads.get(tag) or _value_head(tag)) + pack(float(value))
                            for tag, value in values.items()])
    except OverflowError:  # a value beyond float32 (protobuf stores inf), or the cases above
        return make_event(values, step, wall).SerializeToString()
    head = b"\x09" + _DOUBLE.pack(wall)
    if step:
        head += b"\x10" + _varint(step & 0xFFFFFFFFFFFFFFFF)
    return head + b"\x2a" + _varint(len(summary)) + summary


class DirectEvents:
    """Writes events of ``summary_writer``'s default event file on the calling thread, where safe.

    Args:
        summary_writer: A ``SummaryWriter`` whose event files :func:`tbmem._internal._safe_io.install` guarded.
    """

    def __init__(self, summary_writer: Any) -> None:
        self._summary_writer = summary_writer
        self._file_writer: Any = None
        self._async: Any = None
        self._queue: Any = None

    def _target(self) -> Any:
        """The asynchronous writer of the current default event file, or None where unsafe."""
        file_writer = tbp.default_file_writer(self._summary_writer)
        if file_writer is not self._file_writer:  # first use, or SummaryWriter opened a new file
            self._file_writer = file_writer
            self._async, self._queue = tbp.direct_target(file_writer, _guarded_local)
        return self._async

    def queue(self, values: Mapping[str, float], step: int, walltime: float | None = None) -> bool:
        """Queue one event of ``values`` for TensorBoard's writer thread, as
        ``FileWriter.add_event(make_event(...))`` does (the same bytes, encoded by
        :func:`encode_event`); False where the writer is not TensorBoard's own, so the caller
        adds the event itself. Raises what ``add_event`` raises (a closed writer)."""
        self._target()
        aw = self._queue
        if aw is None:
            return False
        tbp.queue_bytes(aw, encode_event(values, step, walltime))
        return True

    def write(self, values: Mapping[str, float], step: int, walltime: float | None = None) -> bool:
        """Write one event of ``values`` now; False when it must go through TensorBoard's queue."""
        aw = self._target()
        return aw is not None and tbp.append_now(aw, encode_event(values, step, walltime))

    def write_encoded(self, data: bytes) -> bool:
        """Write one serialized ``Event`` now; False when it must go through TensorBoard's queue."""
        aw = self._target()
        return aw is not None and tbp.append_now(aw, data)


def _guarded_local(record_writer: Any) -> bool:
    """tbmem's guarded record writer on a local file: each record appended and the file closed at once."""
    return isinstance(record_writer, SafeRecordWriter) and record_writer.local
