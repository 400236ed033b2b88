"""The step path's components of :class:`tbmem.MemoryWriter`: one small protocol, built only when configured.

A component is what the step hooks call besides the probes and the census: the ranks
(:class:`tbmem._internal.ranks.support.RankSupport`), the snapshots (:class:`tbmem.SnapshotManager`)
and the alerts (:class:`tbmem._internal.alerts.AlertMonitor`). Each is wrapped in a :class:`StepComponent`
(the hooks the step path calls) and the writer keeps tuples of the configured ones
(:class:`Components`): those that need every step (``each_step``: ranks, snapshots) and those that
see the record (``on_record``: ranks, alerts). The step path loops over the tuples, so an
unconfigured component costs nothing and no step tests a nullable attribute; a loop that skips
steps (:meth:`tbmem.MemoryWriter.next_due`) may do so only while ``each_step`` is empty.

The profile windows stay gated by one comparison (``step >= profile_at``), because their
``enter`` hook decides whether a step is due; the spike detector sees scalars, not steps.

Example:
    >>> from tbmem._internal._writer_components import Components
    >>> calls = []
    >>> class Probe:
    ...     name = "probe"
    ...     def on_begin(self, step): calls.append(("begin", step))
    ...     def on_step(self, step): calls.append(("step", step))
    ...     def on_record(self, step, readings): calls.append(("record", step))
    ...     def close(self): calls.append(("close",))
    >>> parts = Components()
    >>> parts.add(Probe(), each_step=True, on_record=False)
    >>> [c.name for c in parts.each_step], parts.on_record
    (['probe'], ())
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from tbmem._internal._log import report_once

if TYPE_CHECKING:  # pragma: no cover
    from tbmem._internal.alerts import AlertMonitor
    from tbmem._internal.ranks.support import RankSupport
    from tbmem._internal.snapshot import SnapshotManager

__all__ = ["AlertsComponent", "Components", "RanksComponent", "SnapshotsComponent", "StepComponent"]


class StepComponent(Protocol):
    """The hooks the writer's step path calls on a component."""

    name: str

    def on_begin(self, step: int) -> None:
        """A training step begins (``begin_step``)."""

    def on_step(self, step: int) -> None:
        """Every ``log_memory`` call, due or not (only for components in ``each_step``)."""

    def on_record(self, step: int, readings: Mapping[str, float] | None) -> None:
        """A record was read and written (None: monitoring is off, ranks still join the collective)."""

    def close(self) -> None:
        """The writer closes."""


class Components:
    """The configured components, as the tuples the step path loops over; see the module docstring."""

    __slots__ = ("all", "each_step", "on_record")

    def __init__(self) -> None:
        self.all: tuple[StepComponent, ...] = ()
        self.each_step: tuple[StepComponent, ...] = ()
        self.on_record: tuple[StepComponent, ...] = ()

    def add(self, component: StepComponent, *, each_step: bool, on_record: bool) -> None:
        """Add ``component`` after those already added (hooks run in the order of adding)."""
        self.all += (component,)
        if each_step:
            self.each_step += (component,)
        if on_record:
            self.on_record += (component,)

    def remove(self, component: StepComponent) -> None:
        """Switch ``component`` off: no hook of it is called again."""
        self.all = tuple(c for c in self.all if c is not component)
        self.each_step = tuple(c for c in self.each_step if c is not component)
        self.on_record = tuple(c for c in self.on_record if c is not component)

    def failed(self, component: StepComponent, exc: Exception) -> None:
        """A hook of ``component`` raised: reported once, the component switched off."""
        report_once(f"writer:{component.name}", f"tbmem: {component.name} failed and is switched off", exc=exc)
        self.remove(component)


class _NoHooks:
    """The hooks a component does not need, doing nothing (each component overrides only its own)."""

    __slots__ = ()

    def on_begin(self, step: int) -> None:
        pass

    def on_step(self, step: int) -> None:
        pass

    def on_record(self, step: int, readings: Mapping[str, float] | None) -> None:
        pass

    def close(self) -> None:
        pass


class RanksComponent(_NoHooks):
    """The ranks (torch.distributed): every call remembers the step, a record joins the collective."""

    __slots__ = ("ranks",)
    name = "ranks"

    def __init__(self, ranks: RankSupport) -> None:
        self.ranks = ranks

    def on_begin(self, step: int) -> None:
        self.ranks.last_step = step

    def on_step(self, step: int) -> None:
        self.ranks.on_log(step)

    def on_record(self, step: int, readings: Mapping[str, float] | None) -> None:
        self.ranks.on_record(step, readings)

    def close(self) -> None:
        self.ranks.close()


class SnapshotsComponent(_NoHooks):
    """The snapshot manager: its schedule sees every step."""

    __slots__ = ("manager",)
    name = "snapshots"

    def __init__(self, manager: SnapshotManager) -> None:
        self.manager = manager

    def on_step(self, step: int) -> None:
        self.manager.on_step(step)

    def close(self) -> None:
        self.manager.close()


class AlertsComponent(_NoHooks):
    """The alert rules: they see each record's readings."""

    __slots__ = ("monitor",)
    name = "alerts"

    def __init__(self, monitor: AlertMonitor) -> None:
        self.monitor = monitor

    def on_record(self, step: int, readings: Mapping[str, float] | None) -> None:
        if readings is not None:
            self.monitor.on_record(step, readings)
