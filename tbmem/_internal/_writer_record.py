"""The record pipeline of :class:`tbmem.MemoryWriter`: scalars and text entries down the one output path.

Whatever the writer writes (a record of the probes' readings, converted to their tags' units by
:data:`tbmem.TAGS`; a census's scalars and table; the components' entries; ``write_scalars``)
takes one path: the sinks (:class:`tbmem._internal.sinks.fanout.SinkSet`), TensorBoard's event file first
(:class:`tbmem.TensorBoardSink`: one ``Summary`` with a value per tag, written on the calling
thread when records are flushed at once, the custom-scalars layout kept with the tags), then W&B,
MLflow and the user's own; then the components that watch scalars (the spike detector, an open
profile window). In the compact layout of a job a rank's records go to its node's rank table too.

It stands on the writer's state (:mod:`tbmem._internal._writer_base`); the step hooks
(:mod:`tbmem._internal._writer_steps`) and the lifecycle (:mod:`tbmem._internal.writer`) stand on it.

Example:
    >>> import tempfile
    >>> from tbmem import MemoryWriter
    >>> from tbmem._internal._writer_record import RecordPipeline
    >>> with MemoryWriter(tempfile.mkdtemp(), custom_layout=False) as w:
    ...     w.write_scalars({"Memory/RAM/process_rss_GB": 1.5}, step=3)
    >>> isinstance(w, RecordPipeline)
    True
"""

from __future__ import annotations

import warnings
from typing import Mapping, Sequence

from tbmem._internal._writer_base import WriterBase
from tbmem._internal.tags import TAGS, is_loss_tag, loss_tags, named_unit, ranks_tag

__all__ = ["RecordPipeline"]

_STEP_TIME_TAG = TAGS["step_time"].tag
_AGGREGATES = ranks_tag("max", "_").partition("/")[0] + "/"  # rank 0's cross-rank tags: derived, never in the table


def table_scalars(values: Mapping[str, float], loss_patterns: Sequence[str] = ()) -> dict[str, float]:
    """What of a rank's own scalars its node's rank table keeps (compact layout): its losses
    (:func:`tbmem._internal.tags.is_loss_tag`, the run's own ``loss_patterns`` too) and step times; the rank's run is
    deleted unless it matters, so without them ranks 1-N's per-batch loss and step time would be stored nowhere.

    Example:
        >>> table_scalars({"Loss/batch": 0.5, "train/loss": 1, "Perf/step_time_ms": 3.0, "acc": 0.9,
        ...                "Ranks/Loss/batch/max": 0.7})
        {'Loss/batch': 0.5, 'train/loss': 1.0, 'Perf/step_time_ms': 3.0}
    """
    out: dict[str, float] = {}
    patterns = loss_tags(loss_patterns)
    for tag, value in values.items():
        if isinstance(tag, str) and not tag.startswith(_AGGREGATES) and (
                tag == _STEP_TIME_TAG or is_loss_tag(tag, patterns)):
            try:
                out[tag] = float(value)
            except (TypeError, ValueError, RuntimeError):  # RuntimeError: a tensor of many elements
                continue  # not a number: TensorBoard's own add_scalar says so
    return out


class RecordPipeline(WriterBase):
    """What :class:`tbmem.MemoryWriter` writes, and how: scalars and text entries to the sinks."""

    def write_scalars(self, values: Mapping[str, float], step: int, walltime: float | None = None) -> None:
        """Write many scalars as one event: one ``Summary`` with a value per tag (to TensorBoard and
        every other sink), where ``add_scalar`` would write one event per tag.

        With ``flush_each_record`` (the default) the event is written on the calling thread
        (:class:`tbmem.TensorBoardSink`): the next record waits for every queued event anyway,
        and handing an event to TensorBoard's writer thread costs the training thread about twice as
        much (the thread's wake-up and the hand-over of the GIL, measured in a training loop).

        Args:
            values: ``{tag: value}``; tbmem's own tags and units are in :data:`tbmem.TAGS`.
            step: The training step (the x axis).
            walltime: The event's time (seconds since the epoch); None: now.
        """
        if self._table is not None and not self.closed and (kept := table_scalars(values, self.config.loss_tags)):
            self._table(step, kept)
        self._write_values(values, step, walltime)

    def write_readings(self, readings: Mapping[str, float], step: int) -> None:
        """Deprecated: write the values in their tags' units with :meth:`write_scalars`
        (``{tbmem.TAGS[key].tag: value / tbmem.TAGS[key].scale}``)."""
        warnings.warn("MemoryWriter.write_readings is deprecated; use write_scalars with the tags' names and "
                      "units ({tbmem.TAGS[key].tag: value / tbmem.TAGS[key].scale})", DeprecationWarning,
                      stacklevel=2)
        self._write_readings(readings, step)

    def _write_readings(self, readings: Mapping[str, float], step: int) -> None:
        """Raw readings keyed by tag-table keys, converted to their tags' units: a record."""
        self._write_record(_tagged(readings), step)

    def _write_record(self, values: Mapping[str, float], step: int) -> None:
        """A record's scalars (the probes', a census's): in the compact layout every one goes to the
        node's rank table too."""
        if self._table is not None and not self.closed:
            self._table(step, dict(values))
        self._write_values(values, step)

    def _write_values(self, values: Mapping[str, float], step: int, walltime: float | None = None) -> None:
        """One event of ``values``: sent to every sink, then seen by the components that watch scalars."""
        if self.closed:
            self._after_close("write_scalars")
            return
        if not values:
            return
        last = self._last_step  # self._saw(step), inline: a record runs this
        if last is None or step > last:
            self._last_step = step
        self._sinks.log(values, step, walltime)
        for component in self._components.on_scalars:  # spikes, profile windows: only those configured
            try:
                component.on_scalars(values, step)
            except Exception as exc:  # noqa: BLE001 - monitoring must never break training
                self._component_failed(component, exc)

    def _write_text(self, tag: str, text: str, step: int) -> None:
        """A text entry (markdown) at ``step``, to every sink."""
        if self.closed:
            return
        self._saw(step)
        self._sinks.log_text(tag, text, step)


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


