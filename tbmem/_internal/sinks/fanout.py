"""The sinks of one :class:`tbmem.MemoryWriter`: made from names or objects, called in turn, switched off on failure.

Example:
    >>> from tbmem._internal.sinks.fanout import SinkSet
    >>> class Printer:
    ...     def log(self, values, step): print(step, values)
    ...     def log_text(self, tag, text, step): pass
    ...     def log_artifact(self, path, kind): pass
    ...     def close(self): print("closed")
    >>> sinks = SinkSet.open([Printer()], run_name="demo")
    >>> sinks.log({"Memory/RAM/process_rss_GB": 1.5}, 10)
    10 {'Memory/RAM/process_rss_GB': 1.5}
    >>> sinks.close()
    closed
"""

from __future__ import annotations

from typing import Any, Sequence

from tbmem._internal._extras import MissingExtraError
from tbmem._internal._log import report_once

__all__ = ["SinkSet", "SINK_NAMES", "check_sinks", "make_sink"]

#: Sinks that :class:`tbmem.MemoryWriter` makes from a name (set up by each library's environment:
#: ``WANDB_MODE``, ``WANDB_DIR``, ``WANDB_PROJECT``; ``MLFLOW_TRACKING_URI``, ``MLFLOW_EXPERIMENT_NAME``).
SINK_NAMES = ("wandb", "mlflow")
_METHODS = ("log", "log_text", "log_artifact", "close")


def check_sinks(sinks: Any, label: str) -> tuple[Any, ...]:
    """``sinks`` as a tuple of names of :data:`SINK_NAMES` and sink objects; ValueError naming ``label``."""
    if sinks is None:
        return ()
    if isinstance(sinks, (str, bytes)) or not hasattr(sinks, "__iter__"):
        raise ValueError(f"{label} must be a list of sink names {list(SINK_NAMES)} or sink objects, got {sinks!r}")
    out = []
    for sink in sinks:
        if isinstance(sink, str):
            if sink not in SINK_NAMES:
                raise ValueError(f"{label}: unknown sink {sink!r}; the names are {list(SINK_NAMES)} "
                                 "(or pass an object with log, log_text, log_artifact and close)")
        elif not all(callable(getattr(sink, m, None)) for m in _METHODS):
            raise ValueError(f"{label}: {sink!r} is not a sink: it needs methods {', '.join(_METHODS)}")
        out.append(sink)
    return tuple(out)


def make_sink(name: str, *, run_name: str | None = None) -> Any:
    """The sink called ``name``, opened for this process's rank (rank 0 only, by default)."""
    if name == "wandb":
        from tbmem._internal.sinks.wandb_sink import WandbSink

        return WandbSink(name=run_name)
    if name == "mlflow":
        from tbmem._internal.sinks.mlflow_sink import MlflowSink

        return MlflowSink(run_name=run_name)
    raise ValueError(f"unknown sink {name!r}; the names are {list(SINK_NAMES)}")


class SinkSet:
    """The sinks of a writer; a sink that raises is reported once and dropped, the others go on.

    Args:
        sinks: The sinks besides TensorBoard (W&B, MLflow, sink objects), called in this order.
        tensorboard: The writer's built-in :class:`tbmem.TensorBoardSink`, called first (with
            the event's wall time, which only an event file keeps).
    """

    def __init__(self, sinks: Sequence[Any], *, tensorboard: Any = None) -> None:
        self.sinks = list(sinks)
        self.tensorboard = tensorboard

    @classmethod
    def open(cls, specs: Sequence[Any], *, run_name: str | None = None, tensorboard: Any = None) -> "SinkSet | None":
        """Make the named sinks (a missing extra raises :class:`MissingExtraError`); None when there are
        none (and no ``tensorboard`` sink)."""
        sinks = []
        for spec in specs:
            if not isinstance(spec, str):
                sinks.append(spec)
                continue
            try:
                sinks.append(make_sink(spec, run_name=run_name))
            except MissingExtraError:
                raise  # a configuration error (sinks=["wandb"] without wandb), not a fault
            except Exception as exc:  # noqa: BLE001 - a tracker that cannot start must not stop training
                report_once(f"sink:{spec}:open", f"tbmem: the {spec} sink could not be created and is off", exc=exc)
        return cls(sinks, tensorboard=tensorboard) if sinks or tensorboard is not None else None

    def _call(self, method: str, *args: Any) -> None:
        tb = self.tensorboard
        if tb is not None:
            try:
                getattr(tb, method)(*args)
            except Exception as exc:  # noqa: BLE001 - monitoring must never break training
                self._drop(tb, method, exc)
        for sink in list(self.sinks):
            try:
                getattr(sink, method)(*args)
            except Exception as exc:  # noqa: BLE001 - monitoring must never break training
                self._drop(sink, method, exc)

    def _drop(self, sink: Any, method: str, exc: Exception) -> None:
        builtin = sink is self.tensorboard
        rest = ("tbmem writes nothing more to this run's event file" if builtin
                else "TensorBoard's records are complete")
        report_once(f"sink:{id(sink)}", f"tbmem: the sink {type(sink).__name__}.{method} failed and is switched "
                    f"off; training goes on and {rest}", exc=exc)
        if builtin:
            self.tensorboard = None
            return  # its files are the writer's: closed by the writer
        if sink in self.sinks:
            self.sinks.remove(sink)
        if method != "close":
            try:
                sink.close()
            except Exception:  # noqa: BLE001 - already reported: the sink is off
                pass

    def log(self, values: Any, step: int, walltime: float | None = None) -> None:
        """Each sink's ``log`` (TensorBoard's first, with ``walltime``: None is now)."""
        tb = self.tensorboard
        if tb is not None:
            try:
                tb.log(values, step, walltime)
            except Exception as exc:  # noqa: BLE001 - monitoring must never break training
                self._drop(tb, "log", exc)
        for sink in list(self.sinks) if self.sinks else ():
            try:
                sink.log(values, step)
            except Exception as exc:  # noqa: BLE001 - monitoring must never break training
                self._drop(sink, "log", exc)

    def log_text(self, tag: str, text: str, step: int) -> None:
        """Each sink's ``log_text``."""
        self._call("log_text", tag, text, step)

    def log_artifact(self, path: str, kind: str) -> None:
        """Each sink's ``log_artifact``."""
        self._call("log_artifact", path, kind)

    def close(self) -> None:
        """Close every sink; never raises."""
        self._call("close")
        self.sinks = []
        self.tensorboard = None
