"""What a component of a :class:`tbmem.MemoryWriter` may do with its output, and read of the run.

The components (the probes' record, the census, the alert and spike monitors, the snapshot manager,
the profile windows, the ranks) never hold the writer: each is handed an :class:`Emitter`, which
sends what they emit down the writer's one output path (its sinks, TensorBoard's event file first:
scalars as one event, text entries, files) and names what they read (the run folder, the fault
ledger, the watched models). A component can be tested with an emitter of its own.

Example:
    >>> from tbmem._internal._emit import Emitter
    >>> from tbmem._internal._safe_io import FaultLedger
    >>> got = []
    >>> emit = Emitter(log_dir=lambda: "/tmp/run", faults=FaultLedger("/tmp/run"),
    ...                text=lambda tag, text, step: got.append((tag, text, step)))
    >>> emit.add_text("Memory/Alerts", "**Memory alert**", 10)
    >>> got, emit.log_dir
    ([('Memory/Alerts', '**Memory alert**', 10)], '/tmp/run')
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from tbmem._internal._safe_io import FaultLedger

__all__ = ["Emitter"]


def _nothing(*args: object) -> None:
    return None


class Emitter:
    """The output and the run facts one component of a writer gets (each a callable of the writer's).

    Args:
        log_dir: The run folder now (a rank's run moves into its job at close).
        faults: Counts what the disk refused.
        text: ``(tag, markdown, step)``: a text event (and the sinks' text entry).
        readings: ``(raw readings by tag-table key, step)``: scalars in their tags' units.
        record: ``({tag: value}, step)``: the scalars of a record (a census's): every one goes to the
            node's rank table too (compact layout).
        scalars: ``({tag: value}, step)``: scalars as ``MemoryWriter.write_scalars`` writes them.
        artifact: ``(path, kind)``: a file of the run, for the sinks (W&B, MLflow).
        flush: Flush the event file now (rare events that must be on disk before the run can end).
        models: The watched models still alive.
        optimizers: The watched optimizers still alive.
    """

    __slots__ = ("_log_dir", "faults", "_text", "_readings", "_record", "_scalars", "_artifact", "_flush",
                 "_models", "_optimizers")

    def __init__(self, *, log_dir: Callable[[], str], faults: FaultLedger,
                 text: Callable[[str, str, int], object] = _nothing,
                 readings: Callable[[Mapping[str, float], int], object] = _nothing,
                 record: Callable[[Mapping[str, float], int], object] = _nothing,
                 scalars: Callable[[Mapping[str, float], int], object] = _nothing,
                 artifact: Callable[[str, str], object] = _nothing,
                 flush: Callable[[], object] = _nothing,
                 models: Callable[[], list[torch.nn.Module]] = list,
                 optimizers: Callable[[], list[torch.optim.Optimizer]] = list) -> None:
        self._log_dir = log_dir
        self.faults = faults
        self._text, self._readings, self._artifact, self._flush = text, readings, artifact, flush
        self._record, self._scalars = record, scalars
        self._models, self._optimizers = models, optimizers

    @property
    def log_dir(self) -> str:
        """The run folder."""
        return self._log_dir()

    def add_text(self, tag: str, text: str, step: int) -> None:
        """A text event at ``step`` (markdown)."""
        self._text(tag, text, step)

    def write_readings(self, readings: Mapping[str, float], step: int) -> None:
        """Raw readings keyed by tag-table keys, written in their tags' units."""
        self._readings(readings, step)

    def write_record(self, values: Mapping[str, float], step: int) -> None:
        """A record's scalars ``{tag: value}`` as one event (every one in the node's rank table too)."""
        self._record(values, step)

    def write_scalars(self, values: Mapping[str, float], step: int) -> None:
        """Scalars ``{tag: value}`` as one event, as :meth:`tbmem.MemoryWriter.write_scalars` writes them."""
        self._scalars(values, step)

    def log_artifact(self, path: str, kind: str) -> None:
        """A file of the run for the sinks; never raises."""
        self._artifact(path, kind)

    def flush(self) -> None:
        """Flush the event file."""
        self._flush()

    @property
    def watched_models(self) -> list[torch.nn.Module]:
        """The watched models still alive."""
        return self._models()

    @property
    def watched_optimizers(self) -> list[torch.optim.Optimizer]:
        """The watched optimizers still alive."""
        return self._optimizers()
