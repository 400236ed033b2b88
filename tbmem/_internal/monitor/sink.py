"""TensorBoard side of the console monitors: one event per batch, epoch or operation.

Monitors hand a :class:`ScalarSink` raw readings keyed by rows of the tag table
(:data:`tbmem.TAGS`); the sink converts them to the tags' units and writes
them with ``MemoryWriter.write_scalars`` as one event. A plain
``SummaryWriter`` is wrapped in a MemoryWriter whose own memory logging is off.
Write failures are reported once and never raised into training.

Example:
    >>> import tempfile
    >>> from tbmem import MemoryWriter
    >>> from tbmem._internal.monitor.sink import ScalarSink
    >>> with MemoryWriter(tempfile.mkdtemp(), enabled=False) as writer:
    ...     sink = ScalarSink(writer)
    ...     sink.write([("batch_time", None, 0.25), ("op_time", "data loading", 1.5)], step=0)
    ...     sorted(sink.last)
    ['Perf/Operation/data_loading_s', 'Perf/batch_time_s']
"""

from __future__ import annotations

from typing import Any, Iterable

from tbmem._internal._log import report_once
from tbmem._internal.monitor.formatting import tag_name
from tbmem._internal.tags import TAGS, tag_for

__all__ = ["ScalarSink", "make_sink", "Item"]

_MAX_TAGS = 4096  # names are the caller's (operation names): a run that makes new ones stops caching

#: (tag-table key, name for templated tags or None, raw value in bytes/seconds/...)
Item = tuple[str, "str | None", "float | None"]


class ScalarSink:
    """Writes tag-table readings through a MemoryWriter, one event per call.

    Args:
        writer: A :class:`tbmem.MemoryWriter` (or anything with ``write_scalars``),
            or a ``torch.utils.tensorboard.SummaryWriter`` to wrap.

    Raises:
        ValueError: ``writer`` is neither.
    """

    def __init__(self, writer: Any) -> None:
        if not callable(getattr(writer, "write_scalars", None)):
            if not callable(getattr(writer, "add_scalar", None)):
                raise ValueError(f"writer must be a tbmem MemoryWriter or a SummaryWriter, got {type(writer).__name__}")
            from tbmem._internal.writer import MemoryWriter

            writer = MemoryWriter(writer=writer, enabled=False, custom_layout=False)
        self.writer = writer
        self.last: dict[str, float] = {}
        # (key, name) -> (tag, the tag's scale): a monitor writes the same few tags every time
        self._tags: dict[tuple[str, str | None], tuple[str, float]] = {}

    def write(self, items: Iterable[Item], step: int) -> None:
        """Write the items whose value is not None as one event at ``step``."""
        values: dict[str, float] = {}
        tags = self._tags
        try:
            for key, name, raw in items:
                if raw is not None:
                    known = tags.get((key, name))
                    if known is None:
                        known = (tag_for(key, tag_name(name) if name is not None else None), TAGS[key].scale)
                        if len(tags) < _MAX_TAGS:
                            tags[(key, name)] = known
                    values[known[0]] = float(raw) / known[1]  # tbmem._internal.tags.to_unit
            if values:
                self.writer.write_scalars(values, int(step))
        except Exception as exc:  # noqa: BLE001 - a closed or broken writer must not stop training
            report_once("monitor:writer", "tbmem: a monitor could not write to TensorBoard", exc=exc)
        self.last = values


def make_sink(writer: Any) -> ScalarSink | None:
    """A sink for ``writer``, or None when there is no writer."""
    return None if writer is None else ScalarSink(writer)
