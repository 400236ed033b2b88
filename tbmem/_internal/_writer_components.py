"""The step path's components of :class:`tbmem.MemoryWriter`: one small protocol, each built only when configured.

Everything the writer does at a step is a component: the probes (the record), the census, the
snapshots, the alerts, the spike detector, the profile windows and the ranks. Each is a
:class:`StepComponent` (a few hooks, every one a no-op unless the component needs it) around the
object that does the work, and gets its output as a :class:`tbmem._internal._emit.Emitter` (the sinks, with
TensorBoard first): no component holds or calls the writer. The writer keeps the configured ones in
a :class:`Components`, one tuple per hook holding only the components that implement it, and its
step path is a loop over a tuple: an unconfigured component costs nothing and no step tests a
nullable attribute. A component whose hook raises is reported once, switched off and leaves every
tuple.

A step goes through the hooks in this order: ``on_begin`` (``begin_step``), ``on_step`` (every
``log_memory`` call: the ranks, the snapshots' schedule), then, on a due step, ``on_due`` with the
step's :class:`StepCall`, in the order the components were added: the profile windows (an open
window asks for a record and a census at each of its steps), the probes (read and write the
record), the ranks and the alerts (see its readings), the census, and last the profile windows
again (a window closes after its last step's record). ``on_scalars`` sees every scalar event
written (the spike detector, an open window's counters), ``on_oom`` an out-of-memory error.

A component that must be called at steps the record's and the census's schedules do not make due
(the step before a profile window, and every step in it) says so in ``at``: the step path compares
the step with the smallest ``at`` (:attr:`Components.wake_at`), one comparison outside windows.

Example:
    >>> from tbmem._internal._writer_components import Components, NoHooks, StepCall
    >>> class Counter(NoHooks):
    ...     name = "counter"
    ...     def on_due(self, call):
    ...         if call.record:
    ...             print("a record at", call.step)
    >>> parts = Components()
    >>> parts.add(Counter())
    >>> [c.name for c in parts.on_due], parts.each_step
    (['counter'], ())
    >>> for c in parts.on_due:
    ...     c.on_due(StepCall(10, record=True))
    a record at 10
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from tbmem._internal._log import report_once

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from tbmem._internal._emit import Emitter
    from tbmem._internal._large import LargeThreshold
    from tbmem._internal.alerts import AlertMonitor
    from tbmem._internal.probes import Probe
    from tbmem._internal.probes.guard import ProbeGuard
    from tbmem._internal.profile.window import ProfileWindows
    from tbmem._internal.ranks.support import RankSupport
    from tbmem._internal.snapshot import SnapshotManager
    from tbmem._internal.spikes import SpikeMonitor

__all__ = ["AlertsComponent", "CensusComponent", "Components", "NEVER", "NoHooks", "ProbesComponent",
           "ProfileComponent", "RanksComponent", "SnapshotsComponent", "SpikesComponent", "StepCall",
           "StepComponent"]

#: A step no run reaches: a component that needs no call outside the schedules.
NEVER = 2**62
_HOOKS = ("on_begin", "on_step", "on_due", "on_scalars", "on_oom")


class StepCall:
    """One due ``log_memory`` call, handed from component to component: what the step must do and
    what it read so far."""

    __slots__ = ("step", "roots", "where", "record", "census", "readings", "woke")

    def __init__(self, step: int, *, roots: Sequence[torch.Tensor] = (), where: str | None = None,
                 record: bool = False, census: bool = False, woke: bool = False) -> None:
        self.step = step
        self.roots = roots
        self.where = where
        self.record = record  #: write a record (the probes' readings)
        self.census = census  #: take a census
        self.readings: Mapping[str, float] | None = None  #: the record's raw readings, once read
        self.woke = woke  #: the step reached :attr:`Components.wake_at` (a profile window's hooks run)


class StepComponent(Protocol):
    """The hooks the writer's step path calls on a component (see the module docstring)."""

    name: str

    @property
    def at(self) -> int:
        """The first step at which ``on_due`` must run though nothing else is due (NEVER: none)."""

    def on_begin(self, step: int) -> None:
        """A training step begins (``begin_step``)."""

    def on_step(self, step: int) -> None:
        """Every ``log_memory`` call, due or not."""

    def on_due(self, call: StepCall) -> None:
        """A due step: read ``call`` (what is due, the readings so far), add to it."""

    def on_scalars(self, values: Mapping[str, float], step: int) -> None:
        """A scalar event the writer writes (or ``add_scalar``'s value)."""

    def on_oom(self, step: int, exc: BaseException,
               census: dict[str, Any] | None = None) -> tuple[list[str], str | None]:
        """An out-of-memory error leaves the step: ``(files written, why one was not)``; ``census`` is the
        census taken at the error (tbmem._internal.oom.census), where one was."""

    def switch_off(self) -> None:
        """A hook raised: release what the component holds (no hook is called again)."""

    def close(self) -> None:
        """The writer closes."""


class NoHooks:
    """The hooks a component does not need, doing nothing; each component overrides its own (only an
    overridden hook puts the component in that hook's tuple)."""

    __slots__ = ()
    name = "component"

    @property
    def at(self) -> int:
        return NEVER

    def on_begin(self, step: int) -> None:
        pass

    def on_step(self, step: int) -> None:
        pass

    def on_due(self, call: StepCall) -> None:
        pass

    def on_scalars(self, values: Mapping[str, float], step: int) -> None:
        pass

    def on_oom(self, step: int, exc: BaseException,
               census: dict[str, Any] | None = None) -> tuple[list[str], str | None]:
        return [], None

    def switch_off(self) -> None:
        pass

    def close(self) -> None:
        pass


def _implements(component: object, hook: str) -> bool:
    own = getattr(type(component), hook, None)
    return own is not None and own is not getattr(NoHooks, hook)


class Components:
    """The configured components, as the tuples the step path loops over; see the module docstring."""

    __slots__ = ("all", "on_begin", "each_step", "on_due", "on_scalars", "on_oom", "scheduled", "wake_at")

    def __init__(self) -> None:
        self.all: tuple[StepComponent, ...] = ()
        self.on_begin: tuple[StepComponent, ...] = ()
        self.each_step: tuple[StepComponent, ...] = ()  # on_step: while not empty, every call matters
        self.on_due: tuple[StepComponent, ...] = ()
        self.on_scalars: tuple[StepComponent, ...] = ()
        self.on_oom: tuple[StepComponent, ...] = ()
        self.scheduled: tuple[StepComponent, ...] = ()  # those with an ``at`` of their own
        self.wake_at = NEVER

    def add(self, component: StepComponent) -> None:
        """Add ``component`` after those already added (hooks run in the order of adding)."""
        self.all += (component,)
        for hook in _HOOKS:
            if _implements(component, hook):
                tuple_name = "each_step" if hook == "on_step" else hook
                setattr(self, tuple_name, getattr(self, tuple_name) + (component,))
        if _implements(component, "at"):
            self.scheduled += (component,)
        self.rewake()

    def rewake(self) -> None:
        """Read the scheduled components' ``at`` again (after their hooks ran)."""
        self.wake_at = min((c.at for c in self.scheduled), default=NEVER)

    def remove(self, name: str) -> None:
        """Switch the component called ``name`` off (both parts of one in two places): no hook of it is called again."""
        for attr in self.__slots__[:-1]:
            setattr(self, attr, tuple(c for c in getattr(self, attr) if c.name != name))
        self.rewake()

    def failed(self, component: StepComponent, exc: Exception) -> None:
        """A hook of ``component`` raised: reported once, the component switched off."""
        report_once(f"writer:{component.name}", f"tbmem: {component.name} failed and is switched off", exc=exc)
        self.remove(component.name)
        try:
            component.switch_off()
        except Exception as err:  # noqa: BLE001 - already reported: the component is off
            report_once(f"writer:{component.name}:off", f"tbmem: switching {component.name} off failed", exc=err)

    def close(self) -> list[tuple[StepComponent, Exception]]:
        """Close every component in the order of adding (a component in two places once); the failures."""
        failed: list[tuple[StepComponent, Exception]] = []
        closed: set[str] = set()
        for component in self.all:
            if component.name in closed:
                continue
            closed.add(component.name)
            try:
                component.close()
            except Exception as exc:  # noqa: BLE001 - monitoring must never break training
                failed.append((component, exc))
        return failed


# --- the components ------------------------------------------------------------------------------

class ProbesComponent(NoHooks):
    """The record: the probes read on a due step, converted to their tags' units and written as one event.

    Args:
        probes: The probes (a failing one is retried, then switched off, by ``guard``).
        guard: The probes' fault guard (:class:`tbmem._internal.probes.guard.ProbeGuard`).
        emit: Where the record goes (:meth:`tbmem._internal._emit.Emitter.write_readings`).
    """

    __slots__ = ("probes", "guard", "emit", "_last")
    name = "probes"

    def __init__(self, probes: list[Probe], guard: ProbeGuard, emit: Emitter) -> None:
        self.probes, self.guard, self.emit = probes, guard, emit
        self._last: tuple[float, int] | None = None  # (perf_counter, step) of the last record

    def read(self, step: int) -> dict[str, float]:
        """Every probe's readings now, and the step time since the last record."""
        readings: dict[str, float] = {}
        probes, call = self.probes, self.guard.call
        for probe in list(probes):
            result = call(probes, probe, probe.read)
            if result:
                readings.update(result)
        now = time.perf_counter()
        last = self._last
        if last is not None and step > last[1]:
            readings["step_time"] = (now - last[0]) / (step - last[1])
        self._last = (now, step)
        return readings

    def on_due(self, call: StepCall) -> None:
        if call.record:
            readings = call.readings = self.read(call.step)
            self.emit.write_readings(readings, call.step)

    def close(self) -> None:
        for probe in self.probes:
            self.guard.call(self.probes, probe, probe.stop)


class CensusComponent(NoHooks):
    """The tensor census (:func:`tbmem.take_census`) on the steps it is due: its scalars, its
    markdown table (a text entry) and a line of the run's census side file.

    Args:
        top_k, device: The census's options (:class:`tbmem.MemoryWriterConfig`).
        large: Splits out tensors above ``large_tensor_mb``.
        emit: Where the census goes, and the watched models and optimizers.
        stop_capture: Undoes the heap capture the census started (at close or when switched off).
    """

    __slots__ = ("top_k", "device", "module_depth", "large", "emit", "stop_capture")
    name = "census"

    def __init__(self, *, top_k: int, device: int | None, large: LargeThreshold, emit: Emitter,
                 stop_capture: Callable[[], Any], module_depth: int = 1) -> None:
        self.top_k, self.device, self.large, self.emit, self.stop_capture = top_k, device, large, emit, stop_capture
        self.module_depth = module_depth

    def on_due(self, call: StepCall) -> None:
        if call.census:
            self.take(call.step, call.roots, call.where or "where the training loop called log_memory")

    def take(self, step: int, roots: Iterable[torch.Tensor], where: str) -> None:
        """Take a census and write it."""
        from tbmem._internal.census import take_census
        from tbmem._internal.logdir.census_log import append_census
        from tbmem._internal.tags import TAGS

        emit = self.emit
        census = take_census(models=emit.watched_models, optimizers=emit.watched_optimizers, roots=tuple(roots),
                             top_k=self.top_k, device=self.device, module_depth=self.module_depth)
        census = dataclasses.replace(self.large.apply(census), where=where)
        emit.write_record(census.scalars(), step)
        emit.add_text(TAGS["census_text"].tag, census.to_markdown(), step)
        # every census, exact, for the Memory tab; a full disk is counted like the other writes
        faults = emit.faults
        append_census(emit.log_dir, step, census,
                      on_os_error=lambda where, exc: faults.failed(where, exc, census_lines=1))

    def switch_off(self) -> None:
        self.stop_capture()

    def close(self) -> None:
        self.stop_capture()


class SnapshotsComponent(NoHooks):
    """The snapshot manager: its schedule sees every step; it writes the out-of-memory snapshot."""

    __slots__ = ("manager",)
    name = "snapshots"

    def __init__(self, manager: SnapshotManager) -> None:
        self.manager = manager

    def on_step(self, step: int) -> None:
        self.manager.on_step(step)

    def on_oom(self, step: int, exc: BaseException,
               census: dict[str, Any] | None = None) -> tuple[list[str], str | None]:
        from tbmem._internal._safe_io import describe

        try:
            paths = list(self.manager.on_oom(step, exc, census=census) or [])
        except Exception as err:  # noqa: BLE001 - the OOM must reach the user, not this
            return [], describe(err)
        return paths, self.manager.last_error

    def switch_off(self) -> None:
        self.manager.close()  # a recording left running would cost every later step

    def close(self) -> None:
        self.manager.close()


class AlertsComponent(NoHooks):
    """The alert rules: they see each record's readings."""

    __slots__ = ("monitor",)
    name = "alerts"

    def __init__(self, monitor: AlertMonitor) -> None:
        self.monitor = monitor

    def on_due(self, call: StepCall) -> None:
        if call.readings is not None:
            self.monitor.on_record(call.step, call.readings)


class SpikesComponent(NoHooks):
    """The loss-spike detector: it sees every scalar event written, and ``add_scalar``'s values."""

    __slots__ = ("monitor",)
    name = "spikes"

    def __init__(self, monitor: SpikeMonitor) -> None:
        self.monitor = monitor

    def on_scalars(self, values: Mapping[str, float], step: int) -> None:
        self.monitor.on_scalars(values, step)


class ProfileComponent(NoHooks):
    """The profile windows (:class:`tbmem._internal.profile.window.ProfileWindows`): added to the step path twice,
    before the record (a window opens; each of its steps asks for a record, and a census with
    ``census=True``) and after it (:attr:`closing`: the window closes after its last step)."""

    __slots__ = ("windows", "closing")
    name = "profile"

    def __init__(self, windows: ProfileWindows) -> None:
        self.windows = windows
        self.closing = _ProfileClosing(windows)

    @property
    def at(self) -> int:
        return self.windows.at

    def on_begin(self, step: int) -> None:
        windows = self.windows
        if step >= windows.at:
            windows.begin(step)

    def on_due(self, call: StepCall) -> None:
        windows = self.windows
        if call.woke and windows.enter(call.step):
            call.record = True
            if windows.config.census:
                call.census = True

    def on_scalars(self, values: Mapping[str, float], step: int) -> None:
        self.windows.on_scalars(step, values)

    def on_oom(self, step: int, exc: BaseException,
               census: dict[str, Any] | None = None) -> tuple[list[str], str | None]:
        # the OOM in the window's trace, written now: the run may end here
        self.windows.instant("out of memory", step=step, error=f"{type(exc).__name__}: {exc}"[:300])
        self.windows.close()
        return [], None

    def switch_off(self) -> None:
        self.windows.off = True
        self.windows.close()

    def close(self) -> None:
        self.windows.close()  # a window still open: its trace, cut short


class _ProfileClosing(NoHooks):
    """The profile windows after the record: the open window closes after its last step."""

    __slots__ = ("windows",)
    name = "profile"

    def __init__(self, windows: ProfileWindows) -> None:
        self.windows = windows

    def on_due(self, call: StepCall) -> None:
        if call.woke and (call.record or call.census):
            self.windows.leave(call.step)

    def switch_off(self) -> None:  # either part failing switches the windows off
        self.windows.off = True
        self.windows.close()


class RanksComponent(NoHooks):
    """The ranks (torch.distributed): every call remembers the step, a record joins the collective
    (while monitoring is off too: every rank joins it)."""

    __slots__ = ("ranks",)
    name = "ranks"

    def __init__(self, ranks: RankSupport) -> None:
        self.ranks = ranks

    def on_begin(self, step: int) -> None:
        self.ranks.last_step = step

    def on_step(self, step: int) -> None:
        self.ranks.on_log(step)

    def on_due(self, call: StepCall) -> None:
        if call.record:
            self.ranks.on_record(call.step, call.readings)

    def close(self) -> None:
        self.ranks.close()
