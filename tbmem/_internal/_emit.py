"""What a component of a :class:`tbmem.MemoryWriter` may do with its output, and read of the run.

The components (the alert and spike monitors, the snapshot manager) never hold the writer: each is
handed an :class:`Emitter`, which sends what they emit down the writer's one output path (the
event file and the sinks: :meth:`tbmem.MemoryWriter.write_readings` for scalars, the same text
events as the census table, the sinks for files) and names what they read (the run folder, the
fault ledger, the watched models). A component can be tested with an emitter of its own.

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
        artifact: ``(path, kind)``: a file of the run, for the sinks (W&B, MLflow).
        flush: Flush the event file now (rare events that must be on disk before the run can end).
        models: The watched models still alive.
        optimizers: The watched optimizers still alive.
    """

    __slots__ = ("_log_dir", "faults", "_text", "_readings", "_artifact", "_flush", "_models", "_optimizers")

    def __init__(self, *, log_dir: Callable[[], str], faults: FaultLedger,
                 text: Callable[[str, str, int], object] = _nothing,
                 readings: Callable[[Mapping[str, float], int], object] = _nothing,
                 artifact: Callable[[str, str], object] = _nothing,
                 flush: Callable[[], object] = _nothing,
                 models: Callable[[], list[torch.nn.Module]] = list,
                 optimizers: Callable[[], list[torch.optim.Optimizer]] = list) -> None:
        self._log_dir = log_dir
        self.faults = faults
        self._text, self._readings, self._artifact, self._flush = text, readings, artifact, flush
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
