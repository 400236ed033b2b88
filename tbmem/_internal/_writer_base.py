"""The state of a :class:`tbmem.MemoryWriter` and what every part of it relies on, declared once.

:class:`WriterBase` is the ``SummaryWriter`` a MemoryWriter is, with the attributes its parts
share (typed here, set in :meth:`tbmem.MemoryWriter.__init__`) and the helpers they all call:
the fault guards (a failing component is reported once and switched off), flushing, the run's
folder and watched objects. Above it, in order: the record pipeline (:mod:`tbmem._internal._writer_record`),
the step hooks and the out-of-memory record (:mod:`tbmem._internal._writer_steps`), the lifecycle
(:mod:`tbmem._internal.writer`). Each part calls only what is below it.

Example:
    >>> import tempfile
    >>> from torch.utils.tensorboard import SummaryWriter
    >>> from tbmem import MemoryWriter
    >>> from tbmem._internal._writer_base import WriterBase
    >>> with MemoryWriter(tempfile.mkdtemp(), census_every=0) as w:
    ...     isinstance(w, WriterBase), isinstance(w, SummaryWriter), w.last_step
    (True, True, None)
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.tensorboard import SummaryWriter

from tbmem._internal import _process
from tbmem._internal._log import report_once

if TYPE_CHECKING:  # pragma: no cover
    from tbmem._internal._emit import Emitter
    from tbmem._internal._safe_io import FaultLedger
    from tbmem._internal._writer_components import Components, ProbesComponent, StepComponent
    from tbmem._internal.alerts import AlertMonitor
    from tbmem._internal.config import MemoryWriterConfig
    from tbmem._internal.logdir.fs import RemoteMirror
    from tbmem._internal.probes import Probe
    from tbmem._internal.probes.guard import ProbeGuard
    from tbmem._internal.profile.window import ProfileWindows
    from tbmem._internal.ranks.support import RankSupport
    from tbmem._internal.sinks.fanout import SinkSet
    from tbmem._internal.sinks.tensorboard import TensorBoardSink
    from tbmem._internal.snapshot import SnapshotManager
    from tbmem._internal.spikes import SpikeMonitor

__all__ = ["WriterBase"]


class WriterBase(SummaryWriter):
    """A SummaryWriter with a MemoryWriter's state; see the module docstring."""

    config: MemoryWriterConfig
    closed: bool
    _active: bool  # monitoring on (enabled=True)
    _log_dir: str
    _adopted: SummaryWriter | None  # the SummaryWriter handed over as writer=, whose files these are
    _mirror: RemoteMirror | None
    _at_exit: Callable[[], None] | None
    _last_step: int | None
    _faults: FaultLedger
    _emit: Emitter  # what the components emit through: the sinks below
    # the output: every sink, TensorBoard's event file first (tbmem._internal.sinks.tensorboard)
    _sinks: SinkSet
    _tensorboard: TensorBoardSink
    _table: Callable[[int, dict[str, float]], None] | None  # the node's rank table (compact layout)
    # the readings
    _probes: list[Probe]
    _probe_guard: ProbeGuard
    _record: ProbesComponent  # the probes' record (in the step loop while monitoring is on)
    _census_every: int  # 0: no census
    _models: list[weakref.ref[torch.nn.Module]]
    _optimizers: list[weakref.ref[torch.optim.Optimizer]]
    # the components the step path loops over, only the configured ones (tbmem._internal._writer_components)
    _components: Components
    # what the components wrap, None unless configured: read outside the step path only
    _ranks: RankSupport | None
    _snapshots: SnapshotManager | None
    _alerts: AlertMonitor | None
    _spikes: SpikeMonitor | None
    _profile: ProfileWindows | None

    def _after_close(self, what: str) -> None:
        report_once(f"closed:{id(self)}", _process.ignored_write_line(self, what))

    @property
    def faults(self) -> FaultLedger:
        """What could not be written to disk (events and snapshots dropped, the last error)."""
        return self._faults

    @property
    def last_step(self) -> int | None:
        """The largest step logged so far (None before the first)."""
        return self._last_step

    def _saw(self, step: int) -> None:
        if self._last_step is None or step > self._last_step:
            self._last_step = step

    @property
    def summary_writer(self) -> SummaryWriter:
        """The ``SummaryWriter`` whose event files this writer writes: the one handed over as
        ``writer=``, else the MemoryWriter itself."""
        return self._adopted if self._adopted is not None else self

    @property  # SummaryWriter sets a plain attribute: this keeps it absolute
    def log_dir(self) -> str:
        """The directory the event files are written to (absolute: resolved when the writer opened)."""
        return self._log_dir

    @log_dir.setter
    def log_dir(self, value: str) -> None:  # SummaryWriter.__init__ sets it
        self._log_dir = value

    def log_artifact(self, path: str, kind: str) -> None:
        """Send a file of the run (a snapshot, a trace) to the sinks (W&B, MLflow); never raises."""
        if not self.closed:
            self._sinks.log_artifact(path, kind)

    @property
    def watched_models(self) -> list[torch.nn.Module]:
        """The watched models still alive."""
        return [m for m in (r() for r in self._models) if m is not None]

    @property
    def watched_optimizers(self) -> list[torch.optim.Optimizer]:
        """The watched optimizers still alive."""
        return [o for o in (r() for r in self._optimizers) if o is not None]

    # --- faults: monitoring that fails is switched off, never raised into training ---------
    def _guard(self, probe: Probe, fn: Any) -> Any:
        """Run a probe call; a failure is retried with backoff, then switches the probe off."""
        return self._probe_guard.call(self._probes, probe, fn)

    def _component_failed(self, component: StepComponent, exc: Exception) -> None:
        """A component's hook raised: reported once, switched off (it leaves every tuple)."""
        self._components.failed(component, exc)

    def flush(self) -> None:
        """Flush pending events to disk (never raises an I/O error: see docs/reliability.md)."""
        if not self.closed:
            try:
                self._tensorboard.flush()
            except OSError as exc:  # only where tbmem._internal._safe_io could not guard the writer thread
                self._faults.failed(self.log_dir, exc)

    def _flush_quietly(self) -> None:
        try:
            self.flush()
        except Exception as exc:  # noqa: BLE001 - an exception on its way to the user goes first
            report_once("writer:flush", "tbmem: flushing the event files failed", exc=exc)
