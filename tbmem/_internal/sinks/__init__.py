"""Sinks: where a :class:`tbmem.MemoryWriter`'s records go: TensorBoard, W&B, MLflow, your own.

Every writer has one built in, :class:`TensorBoardSink` (the run's event file, first).
``MemoryWriter(sinks=["wandb", "mlflow"])`` (or sink objects) sends every scalar event the writer
writes, its census tables and its snapshot files to each sink too, on the same training steps.
A sink is any object with the four methods of :class:`Sink`; :class:`WandbSink` and
:class:`MlflowSink` run their tracker's calls on a thread of their own, and a sink that fails is
reported once and switched off (docs/sinks.md).

Example:
    >>> import tempfile
    >>> from tbmem import MemoryWriter
    >>> class Printer:
    ...     def log(self, values, step): print(step, sorted(values))
    ...     def log_text(self, tag, text, step): pass
    ...     def log_artifact(self, path, kind): pass
    ...     def close(self): pass
    >>> with MemoryWriter(tempfile.mkdtemp(), sinks=[Printer()], custom_layout=False) as w:
    ...     w.write_scalars({"Memory/RAM/process_rss_GB": 1.0}, step=5)
    5 ['Memory/RAM/process_rss_GB']
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tbmem._internal._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "Sink": "tbmem._internal.sinks.base",
    "BackgroundSink": "tbmem._internal.sinks.base",
    "SinkSet": "tbmem._internal.sinks.fanout",
    "SINK_NAMES": "tbmem._internal.sinks.fanout",
    "TensorBoardSink": "tbmem._internal.sinks.tensorboard",
    "WandbSink": "tbmem._internal.sinks.wandb_sink",
    "MlflowSink": "tbmem._internal.sinks.mlflow_sink",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # pragma: no cover
    from tbmem._internal.sinks.base import BackgroundSink, Sink
    from tbmem._internal.sinks.fanout import SINK_NAMES, SinkSet
    from tbmem._internal.sinks.mlflow_sink import MlflowSink
    from tbmem._internal.sinks.tensorboard import TensorBoardSink
    from tbmem._internal.sinks.wandb_sink import WandbSink


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
