"""TensorBoard as a sink: the first one, built into every :class:`tbmem.MemoryWriter`, and the only
part of the writer that touches TensorBoard's internals (through :mod:`tbmem._internal._tensorboard_private`).

Everything a writer's components emit (records, census scalars and tables, alerts, spikes, the
snapshots' entries, cross-rank aggregates, ``write_scalars``) reaches the run's event file through
the writer's :class:`TensorBoardSink` and the other sinks (W&B, MLflow) through the same fan-out
(:class:`tbmem._internal.sinks.fanout.SinkSet`): one record, one output path. A scalar event is one ``Summary``
with a value per tag. For the writer's own run (:meth:`TensorBoardSink.for_run`) the sink also

- guards the event files against a full or read-only disk (:func:`tbmem._internal._safe_io.install`, with the
  compiled CRC for these files only) and holds a staged rank's events in batches;
- writes each event on the calling thread where records are flushed at once (``flush_each_record``:
  :class:`tbmem._internal._direct_events.DirectEvents`, the bytes TensorBoard's writer thread would write, in
  the same order), else queues them for that thread; :attr:`TensorBoardSink.pending` says whether
  something waits in the queue, so the writer flushes only then;
- keeps the custom-scalars layout in step with the tags written (:class:`tbmem._internal.layout.LayoutTracker`).

Used on its own, ``TensorBoardSink(SummaryWriter(...))`` is the same output for another
``SummaryWriter`` (a second event file) and the reference implementation of :class:`tbmem.Sink`.

Example:
    >>> import tempfile
    >>> from torch.utils.tensorboard import SummaryWriter
    >>> from tbmem._internal.sinks import TensorBoardSink
    >>> sink = TensorBoardSink(SummaryWriter(tempfile.mkdtemp()))
    >>> sink.log({"Memory/RAM/process_rss_GB": 1.5}, step=10)
    >>> sink.log_text("Memory/Tensor_Census", "| a | b |", step=10)
    >>> sink.close()
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from torch.utils.tensorboard import SummaryWriter

from tbmem._internal import _tensorboard_private as tbp
from tbmem._internal._direct_events import DirectEvents, make_event
from tbmem._internal._log import report_once
from tbmem._internal._safe_io import FaultLedger, hold_events
from tbmem._internal._safe_io import install as install_safe_io

if TYPE_CHECKING:  # pragma: no cover
    from tbmem._internal.layout import LayoutTracker

__all__ = ["TensorBoardSink", "adopt_event_files"]


class TensorBoardSink:
    """Writes what a sink receives to a ``SummaryWriter``'s event file.

    Args:
        writer: The ``torch.utils.tensorboard.SummaryWriter`` to write to; closed by :meth:`close`.
        faults: Counts the events the disk refused (None: a refused write raises, as TensorBoard's).
        direct: Write each event on the calling thread where the record writer allows it
            (see the module docstring); else events go through TensorBoard's queue.
        layout: Keep the custom-scalars layout of the tags written.
        artifacts: List each file sent as a text entry ``Artifacts/<kind>`` (TensorBoard keeps no
            files); the writer's own run leaves them out (its files are in the run already).
        owned: :meth:`close` closes ``writer``.
    """

    def __init__(self, writer: Any, *, faults: FaultLedger | None = None, direct: bool = False,
                 layout: bool = False, artifacts: bool = True, owned: bool = True) -> None:
        self.writer = writer
        self.faults = faults
        self.events = DirectEvents(writer)
        self._direct = direct
        self._artifacts = 0 if artifacts else -1
        self._owned = owned
        self._layout: LayoutTracker | None = None
        if layout:
            from tbmem._internal.layout import LayoutTracker

            self._layout = LayoutTracker()
        #: Something was queued for TensorBoard's writer thread since the last direct write or flush.
        self.pending = False
        #: A staged rank's run: its events are held in batches and read by nobody before close.
        self.staged = False

    @classmethod
    def for_run(cls, writer: SummaryWriter, *, faults: FaultLedger, fast_crc: bool, direct: bool,
                layout: bool, held_bytes: int = 0) -> "TensorBoardSink":
        """The built-in sink of a MemoryWriter's own event files (``writer`` is the MemoryWriter):
        guarded against a full disk, checksummed by the compiled CRC (these files only), a staged
        run's events held up to ``held_bytes`` at a time; closed by the writer, not the sink."""
        install_safe_io(writer, faults, fast_crc=fast_crc)
        sink = cls(writer, faults=faults, direct=direct, layout=layout, artifacts=False, owned=False)
        sink.staged = held_bytes > 0 and hold_events(writer, held_bytes) > 0
        return sink

    @property
    def needs_flush(self) -> bool:
        """Whether a flush has something to write: events queued, and the run is not staged."""
        return self.pending and not self.staged

    def log(self, values: Mapping[str, float], step: int, walltime: float | None = None) -> None:
        """The scalars of one event (the custom-scalars layout first, when a new kind of tag appears)."""
        if self._layout is not None:
            self._update_layout(values)
        events = self.events
        try:
            if self._direct and events.write(values, step, walltime):
                self.pending = False  # written after every event queued before it: the file is complete
                return
            self.pending = True
            if not events.queue(values, step, walltime):  # not TensorBoard's own FileWriter
                tbp.add_event(self.writer, make_event(values, step, walltime), step)
        except OSError as exc:  # only where tbmem._internal._safe_io could not guard the writer thread
            self._refused(exc)

    def log_text(self, tag: str, text: str, step: int) -> None:
        """A text entry (TensorBoard's text plugin), written on this thread where :meth:`log` writes there."""
        try:
            if self._direct:
                from tensorboard.compat.proto.event_pb2 import Event
                from torch.utils.tensorboard.summary import text as text_summary

                event = Event(wall_time=time.time(), step=int(step), summary=text_summary(tag, text))
                if self.events.write_encoded(event.SerializeToString()):
                    self.pending = False
                    return
            self.pending = True
            SummaryWriter.add_text(self.writer, tag, text, step)
        except OSError as exc:
            self._refused(exc)

    def log_artifact(self, path: str, kind: str) -> None:
        # TensorBoard has no artifacts: the file stays where it is, and the run lists it
        if self._artifacts < 0:
            return
        self._artifacts += 1
        self.log_text(f"Artifacts/{kind}", f"`{path}`", self._artifacts)

    def flush(self) -> None:
        """Flush the event files (raises what TensorBoard's flush raises: the writer counts it)."""
        self.pending = False
        SummaryWriter.flush(self.writer)

    def close(self) -> None:
        """Close the ``SummaryWriter`` when the sink owns it (the writer's own run: the writer does)."""
        if self._owned:
            self.writer.close()

    def _update_layout(self, values: Mapping[str, float]) -> None:
        tracker = self._layout
        try:
            layout = tracker.see(values) if tracker is not None else None
            if layout is not None:
                self.pending = True
                SummaryWriter.add_custom_scalars(self.writer, layout)
        except Exception as exc:  # noqa: BLE001 - a chart layout is never worth a training run
            report_once("writer:layout", "tbmem: writing the custom-scalars layout failed; it is off", exc=exc)
            self._layout = None

    def _refused(self, exc: OSError) -> None:
        if self.faults is None:
            raise exc
        self.faults.failed(self.faults.log_dir, exc, events=1)


def adopt_event_files(writer: Any) -> None:
    """Make sure ``writer``'s default event file is open (torch reopens it when it was closed), before a
    MemoryWriter takes its files over (``MemoryWriter(writer=...)``)."""
    tbp.default_file_writer(writer)
