"""The step hooks of :class:`tbmem.MemoryWriter`: what a training loop calls at each step.

:meth:`~StepHooks.log_memory` notes the step and writes a record, a census or a snapshot when one
is due (:mod:`tbmem._internal._writer_record`); :meth:`~StepHooks.next_due` lets a loop skip the calls in
between; :meth:`~StepHooks.monitored_step`, :meth:`~StepHooks.begin_step` and
:meth:`~StepHooks.step_failed` bracket a step, so an out-of-memory error gets its snapshot and
record (:meth:`tbmem.MemoryWriter.handle_oom`) before it goes on unchanged. These run at every
step, inside the training loop: each does as little as it can when nothing is due.

They stand on the record pipeline (:mod:`tbmem._internal._writer_record`); :mod:`tbmem._internal.writer`'s lifecycle
stands on them. :meth:`~StepHooks.handle_oom` assembles the out-of-memory record (in ``_save_oom``).

Example:
    >>> import tempfile
    >>> from tbmem import MemoryWriter
    >>> with MemoryWriter(tempfile.mkdtemp(), every=5, census_every=0) as w:
    ...     [w.log_memory(step) for step in range(6)], w.next_due(6)
    ([True, False, False, False, False, True], 10)
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Sequence

from tbmem._internal import _torch_private as tp
from tbmem._internal._log import logger, oom_line, report_once
from tbmem._internal.oom.runtime import report as explain_oom
from tbmem._internal._safe_io import describe
from tbmem._internal._writer_base import NEVER
from tbmem._internal._writer_record import RecordPipeline

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["StepHooks"]


class StepHooks(RecordPipeline):
    """The per-step calls of :class:`tbmem.MemoryWriter`, and its out-of-memory record."""

    def log_memory(self, step: int, *, roots: Sequence[torch.Tensor] = (), force: bool = False,
                   where: str | None = None) -> bool:
        """Write the memory readings if ``step`` is due; return whether anything was written.

        Args:
            step: The global step (x axis in TensorBoard).
            roots: Tensors (a loss before ``backward``) whose autograd graph the
                census walks to count saved activations.
            force: Write a record even if ``step`` is not due.
            where: When in the step this is called (``"after backward, before zero_grad"``), said
                in the census table: what the census can see depends on it.
        """
        if self.closed:
            self._after_close("log_memory")
            return False
        components = self._components
        for component in components.each_step:  # ranks, snapshots: only those configured
            try:
                component.on_step(step)
            except Exception as exc:  # noqa: BLE001 - monitoring must never break training
                self._component_failed(component, exc)
        if not self._active:  # only the ranks can be here: every rank joins the record's collective
            for component in components.on_record:
                component.on_record(step, None)
            return False
        last = self._last_step  # self._saw(step), inline: this runs at every step
        if last is None or step > last:
            self._last_step = step
        profiled = step >= self._profile_at  # one comparison outside profile windows
        window = profiled and self._profile_hook("enter", step)
        cfg = self.config
        due = force or window or step % cfg.every == 0
        census_due = self._census_on and (step % cfg.census_every == 0 or (window and self._profile_census))
        if not (due or census_due):
            return False
        written = False  # on this thread, after every event queued before it
        if due:
            readings = self._read(step)
            written = self._write_record(readings, step)
            for component in components.on_record:  # ranks, alerts: only those configured
                written = False  # a component may queue events of its own: flushed below
                try:
                    component.on_record(step, readings)
                except Exception as exc:  # noqa: BLE001 - monitoring must never break training
                    self._component_failed(component, exc)
        if census_due and not self._take_census(step, roots, where or "where the training loop called log_memory"):
            written = False  # its table was queued: flushed below
        # a record written on this thread is in the file; a staged run is read by nobody before close
        if cfg.flush_each_record and not written and not self._staged:
            self.flush()
        if profiled:
            self._profile_hook("leave", step)
        return True

    def next_due(self, step: int) -> int:
        """The first step from ``step`` on at which :meth:`log_memory` does more than note the step.

        It is ``step`` itself while snapshots, ranks or a closed writer need every call. A loop
        that skips the calls in between must call :meth:`begin_step` at each step instead (the
        trainers do: a call costs microseconds inside a training step, where the caches are cold).
        """
        if self.closed or not self._active or self._components.each_step:
            return step
        cfg = self.config
        due = -(-step // cfg.every) * cfg.every
        if self._census_on:
            due = min(due, -(-step // cfg.census_every) * cfg.census_every)
        return min(due, max(step, self._profile_at))  # the step before a profile window, and each in it

    def monitored_step(self, step: int, *, log: bool = True) -> contextlib.AbstractContextManager[None]:
        """Run one training step; log memory after it, and on an out-of-memory error save a
        snapshot, write a record, flush, and re-raise the original exception unchanged.

        Args:
            step: The global step.
            log: False when the step calls ``log_memory(step, roots=...)`` itself (mid-step, so
                the census sees the activations); the OOM handling stays.
        """
        return _MonitoredStep(self, step, log)

    def begin_step(self, step: int) -> None:
        """A training step begins (what :meth:`monitored_step` does on entry, for a loop that
        handles its own exceptions with :meth:`step_failed`): it becomes the last step, the one a
        snapshot of another rank's out-of-memory error names."""
        for component in self._components.each_step:
            component.on_begin(step)
        last = self._last_step
        if last is None or step > last:
            self._last_step = step
        if step >= self._profile_at and self._active and not self.closed:
            self._profile_hook("begin", step)

    def _profile_hook(self, name: str, step: int) -> bool:
        """Call the profile windows' ``name`` hook (tbmem._internal.profile.window); never raises."""
        profile = self._profile
        result = False
        try:
            result = bool(getattr(profile, name)(step))
        except Exception as exc:  # noqa: BLE001 - profiling must never end training
            report_once("writer:profile", "tbmem: a profile window failed; profiling is off", exc=exc)
            self._profile = profile = None
        self._profile_at = profile.at if profile is not None else NEVER
        self._profile_census = bool(profile is not None and profile.window is not None and profile.config.census)
        return result

    def step_failed(self, step: int, exc: BaseException) -> None:
        """``exc`` is leaving training step ``step`` (what :meth:`monitored_step` does on an exception):
        an out-of-memory error gets its snapshot and record (:meth:`handle_oom`), any other the events
        flushed. Never raises; the caller re-raises ``exc``.

        A ``try``/``except`` in the loop costs nothing until something is raised (Python 3.11+),
        where a context manager is two calls per step.
        """
        if isinstance(exc, tp.OutOfMemoryError):
            self.handle_oom(step, exc)
        else:
            self._flush_quietly()


    # --- the out-of-memory record: the one place it is assembled ----------------------------
    def handle_oom(self, step: int, exc: BaseException) -> None:
        """Save what can be saved about an out-of-memory error and say so in one line; never raises.

        Whatever fails while saving (a read-only or full disk, a broken probe) is caught here,
        so the caller re-raises the original exception object, unchanged and without a
        ``__context__`` from tbmem.
        """
        try:
            self._save_oom(step, exc)
        except BaseException as err:  # noqa: BLE001 - the OOM must reach the user, not this
            if not isinstance(err, Exception):
                raise  # Ctrl-C while saving: the user asked to stop
            report_once("writer:oom", "tbmem: saving the out-of-memory record failed", exc=err)

    def _save_oom(self, step: int, exc: BaseException) -> None:
        paths: list[str] = []
        snap_error: str | None = None
        if self._active and not self.closed:
            if self._profile is not None:  # the OOM in the window's trace, written now: the run may end here
                self._profile.instant("out of memory", step=step, error=f"{type(exc).__name__}: {exc}"[:300])
                self._profile.close()
                self._profile_at = self._profile.at
            if self._snapshots is not None:
                try:
                    result = self._snapshots.on_oom(step, exc)
                except Exception as err:  # noqa: BLE001
                    result, snap_error = [], describe(err)
                paths = list(result or [])
                snap_error = snap_error or getattr(self._snapshots, "last_error", None)
            try:
                self.write_readings(self._read(step), step)
            except Exception as err:  # noqa: BLE001
                report_once("writer:oom-record", "tbmem: could not write the record at the OOM", exc=err)
        self._flush_quietly()
        # issue 38: the OOM explained in numbers, in the same one stderr block and the run's text tab
        explained = explain_oom(self._emit, step, exc) if self._active else ""
        logger.error("%s", oom_line(step, exc, paths, snap_error) + explained)
        if self._ranks is not None:  # after this rank's snapshot: the other ranks write theirs
            self._ranks.on_oom(step)


class _MonitoredStep:
    """What :meth:`MemoryWriter.monitored_step` returns: a plain context manager, not a generator,
    because it wraps every training step (a generator-based one costs several times as much),
    and an exception leaves it as it came in, with no frame of tbmem added to its traceback."""

    __slots__ = ("writer", "step", "log")

    def __init__(self, writer: StepHooks, step: int, log: bool) -> None:
        self.writer, self.step, self.log = writer, step, log

    def __enter__(self) -> None:
        self.writer.begin_step(self.step)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if exc_type is None:
            if self.log:
                self.writer.log_memory(self.step, where="after the step (monitored_step)")
        elif exc is not None:
            self.writer.step_failed(self.step, exc)
        # None: the exception, if any, goes on unchanged
