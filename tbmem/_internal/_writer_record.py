"""The record pipeline of :class:`tbmem.MemoryWriter`: readings and censuses become events and side files.

A record is the probes' readings (:meth:`RecordPipeline._read`), converted to their tags' units
(:data:`tbmem.TAGS`) and written as one event: one ``Summary`` with a value per tag, on the
calling thread when records are flushed at once (:mod:`tbmem._internal._direct_events`), else queued for
TensorBoard's writer thread. A census adds its scalars, its markdown table (a text event) and a
line of the run's census side file (:func:`tbmem._internal.logdir.census_log.append_census`). The
custom-scalars layout follows the tags written (:class:`tbmem._internal.layout.LayoutTracker`).

It stands on the writer's state (:mod:`tbmem._internal._writer_base`); the step hooks
(:mod:`tbmem._internal._writer_steps`) and the lifecycle (:mod:`tbmem._internal.writer`) stand on it.

Example:
    >>> import tempfile
    >>> from tbmem import MemoryWriter
    >>> from tbmem._internal._writer_record import RecordPipeline
    >>> with MemoryWriter(tempfile.mkdtemp(), custom_layout=False) as w:
    ...     w.write_readings({"ram_rss": 1.5 * 2**30}, step=3)  # raw bytes -> Memory/RAM/process_rss_GB
    >>> isinstance(w, RecordPipeline)
    True
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Iterable, Mapping

from tbmem._internal import _tensorboard_private as tbp
from tbmem._internal._direct_events import make_event
from tbmem._internal._log import report_once
from tbmem._internal.tags import TAGS, is_loss_tag, named_unit, ranks_tag

from torch.utils.tensorboard import SummaryWriter

from tbmem._internal._writer_base import WriterBase

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["RecordPipeline"]

_CENSUS_TEXT_TAG = TAGS["census_text"].tag
_STEP_TIME_TAG = TAGS["step_time"].tag
_AGGREGATES = ranks_tag("max", "_").partition("/")[0] + "/"  # rank 0's cross-rank tags: derived, never in the table


def table_scalars(values: Mapping[str, float]) -> dict[str, float]:
    """What of a rank's own scalars its node's rank table keeps (compact layout): its losses
    (:func:`tbmem._internal.tags.is_loss_tag`) and step times; the rank's run is deleted unless it matters, so
    without them ranks 1-N's per-batch loss and step time would be stored nowhere.

    Example:
        >>> table_scalars({"Loss/batch": 0.5, "train/loss": 1, "Perf/step_time_ms": 3.0, "acc": 0.9,
        ...                "Ranks/Loss/batch/max": 0.7})
        {'Loss/batch': 0.5, 'train/loss': 1.0, 'Perf/step_time_ms': 3.0}
    """
    out: dict[str, float] = {}
    for tag, value in values.items():
        if isinstance(tag, str) and not tag.startswith(_AGGREGATES) and (tag == _STEP_TIME_TAG or is_loss_tag(tag)):
            try:
                out[tag] = float(value)
            except (TypeError, ValueError, RuntimeError):  # RuntimeError: a tensor of many elements
                continue  # not a number: TensorBoard's own add_scalar says so
    return out


class RecordPipeline(WriterBase):
    """What :class:`tbmem.MemoryWriter` writes, and how: records, censuses, texts, the layout."""

    def write_scalars(self, values: Mapping[str, float], step: int, walltime: float | None = None) -> None:
        """Write many scalars as one event: one ``Summary`` with a value per tag.

        With ``flush_each_record`` (the default) the event is written on the calling thread
        (tbmem._internal._direct_events): the next record waits for every queued event anyway, and handing
        an event to TensorBoard's writer thread costs the training thread about twice as much
        (the thread's wake-up and the hand-over of the GIL, measured in a training loop).
        """
        if self._table is not None and not self.closed and (kept := table_scalars(values)):
            self._table(step, kept)
        self._scalars(values, step, walltime)

    def _scalars(self, values: Mapping[str, float], step: int, walltime: float | None = None) -> None:
        """:meth:`write_scalars` without the rank table (the caller sent the record there)."""
        self._write_event(values, step, walltime)
        if self._spikes is not None and not self.closed:
            self._spikes.on_scalars(values, step)

    def _write_event(self, values: Mapping[str, float], step: int, walltime: float | None = None) -> bool:
        """:meth:`write_scalars`; True when the event was written to the file on this thread."""
        if self.closed:
            self._after_close("write_scalars")
            return False
        if not values:
            return False
        self._saw(step)
        if self._sinks is not None:  # W&B, MLflow, ...: the same values on the same step (tbmem._internal.sinks)
            self._sinks.log(values, step)
        if self._profile_at < 0 and self._profile is not None:  # a window is open: its counter tracks
            self._profile.on_scalars(step, values)
        if self._layout is not None:  # queued before the event, so written before it
            self._update_layout(values)
        events = self._events
        try:
            if self._direct is not None and events.write(values, step, walltime):
                return True
            if not events.queue(values, step, walltime):  # what add_summary would queue
                tbp.add_event(self, make_event(values, step, walltime), step)
        except OSError as exc:  # only where tbmem._internal._safe_io could not guard the writer thread
            self._faults.failed(self.log_dir, exc, events=1)
        return False

    def _update_layout(self, values: Mapping[str, float]) -> None:
        tracker = self._layout
        if tracker is None:
            return
        try:
            layout = tracker.see(values)
            if layout is not None:
                SummaryWriter.add_custom_scalars(self, layout)
        except Exception as exc:  # noqa: BLE001 - a chart layout is never worth a training run
            report_once("writer:layout", "tbmem: writing the custom-scalars layout failed; it is off", exc=exc)
            self._layout = None

    def write_readings(self, readings: Mapping[str, float], step: int) -> None:
        """Write raw readings keyed by tag-table keys, converted to their tags' units (a record: in the
        compact layout it goes to the node's rank table too)."""
        values = _tagged(readings)
        if self._table is not None:
            self._table(step, values)
        self._scalars(values, step)

    def _write_record(self, readings: Mapping[str, float], step: int) -> bool:
        """A memory record: one event of the readings in their tags' units (written on this
        thread when records are flushed at once: :meth:`write_scalars`); True when it was."""
        values = _tagged(readings)
        if self._table is not None:
            self._table(step, values)
        return self._write_event(values, step)

    def _read(self, step: int) -> dict[str, float]:
        readings: dict[str, float] = {}
        probes, call = self._probes, self._probe_guard.call  # self._guard, inline
        for probe in list(probes):
            result = call(probes, probe, probe.read)
            if result:
                readings.update(result)
        now = time.perf_counter()
        if self._last_record is not None and step > self._last_record[1]:
            readings["step_time"] = (now - self._last_record[0]) / (step - self._last_record[1])
        self._last_record = (now, step)
        return readings

    def _take_census(self, step: int, roots: Iterable[torch.Tensor], where: str) -> bool:
        """Take a census and write it; True when its events were written on this thread (nothing
        of it is left in TensorBoard's queue)."""
        cfg = self.config
        direct = [False]

        def run() -> None:
            import dataclasses

            from tbmem._internal.census import take_census
            from tbmem._internal.logdir.census_log import append_census

            census = take_census(
                models=self.watched_models, optimizers=self.watched_optimizers, roots=tuple(roots),
                top_k=cfg.top_k, device=cfg.device,
            )
            census = dataclasses.replace(self._large.apply(census), where=where)
            scalars = census.scalars()
            if self._table is not None:
                self._table(step, scalars)
            direct[0] = self._write_event(scalars, step)
            direct[0] = self._write_text(_CENSUS_TEXT_TAG, census.to_markdown(), step) and direct[0]
            # every census, exact, for the Memory tab; a full disk is counted like the other writes
            append_census(self.log_dir, step, census,
                          on_os_error=lambda where, exc: self._faults.failed(where, exc, census_lines=1))

        if not self._guard_call("census", run):
            self._census_on = False
            if self._stop_capture is not None:
                self._stop_capture()
            return False
        return direct[0]

    def _write_text(self, tag: str, text: str, step: int) -> bool:
        """``add_text``, written on this thread where :meth:`write_scalars` writes there (the same
        event bytes: a text ``Summary`` in an ``Event``); True when it was."""
        if self._sinks is not None:
            self._sinks.log_text(tag, text, step)
        if self._direct is not None:
            from tensorboard.compat.proto.event_pb2 import Event
            from torch.utils.tensorboard.summary import text as text_summary

            event = Event(wall_time=time.time(), step=int(step), summary=text_summary(tag, text))
            try:
                if self._events.write_encoded(event.SerializeToString()):
                    self._saw(step)
                    return True
            except OSError as exc:  # only where tbmem._internal._safe_io could not guard the writer thread
                self._faults.failed(self.log_dir, exc, events=1)
                return False
        SummaryWriter.add_text(self, tag, text, step)
        return False


# key -> (tag, scale) in a plain dict: TAGS is a read-only proxy, and a record looks up a dozen keys
_UNITS: dict[str, tuple[str, float]] = {key: (row.tag, row.scale) for key, row in TAGS.items()}


def _tagged(readings: Mapping[str, float]) -> dict[str, float]:
    """Raw readings keyed by tag-table keys as ``{tag: value in the tag's unit}``."""
    units = _UNITS
    tagged = {}
    for key, value in readings.items():
        known = units.get(key)
        # a templated tag's reading, one per pool ("<key>:<name>", tbmem._internal.tags.named_reading)
        tag, scale = known if known is not None else named_unit(key)
        tagged[tag] = float(value) / scale
    return tagged


