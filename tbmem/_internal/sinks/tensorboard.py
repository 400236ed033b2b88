"""TensorBoard as a sink: the first one, and the one every :class:`tbmem.MemoryWriter` has built in.

A MemoryWriter writes its own event file directly (:mod:`tbmem._internal._direct_events`, unchanged: a record
costs what it did before sinks existed); this class is the same output for another
``SummaryWriter``, e.g. a second event file, and the reference implementation of
:class:`tbmem.Sink`. A scalar event is one ``Summary`` with a value per tag, as the writer's.

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

from typing import Any

from tbmem._internal import _tensorboard_private as tbp
from tbmem._internal._direct_events import make_event

__all__ = ["TensorBoardSink"]


class TensorBoardSink:
    """Writes what a sink receives to a ``SummaryWriter`` (artifacts: the path as a text entry).

    Args:
        writer: The ``torch.utils.tensorboard.SummaryWriter`` to write to; closed by :meth:`close`.
    """

    def __init__(self, writer: Any) -> None:
        self.writer = writer
        self._artifacts = 0

    def log(self, values: dict[str, float], step: int) -> None:
        tbp.add_event(self.writer, make_event(values, step, None), step)

    def log_text(self, tag: str, text: str, step: int) -> None:
        self.writer.add_text(tag, text, step)

    def log_artifact(self, path: str, kind: str) -> None:
        # TensorBoard has no artifacts: the file stays where it is, and the run lists it
        self._artifacts += 1
        self.writer.add_text(f"Artifacts/{kind}", f"`{path}`", self._artifacts)

    def close(self) -> None:
        self.writer.close()
