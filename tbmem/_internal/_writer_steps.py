"""The step hooks of :class:`tbmem.MemoryWriter`: what a training loop calls at each step.

One way to drive a step: call :meth:`~StepHooks.log_memory` once per training step (where the
census should look: after backward and the optimizer step, or with ``roots=(loss,)`` before
backward). It notes the step and, when something is due, runs the configured components
(:mod:`tbmem._internal._writer_components`): the record, the census, the snapshots, the alerts, the profile
windows, the ranks. An exception leaving the step goes to :meth:`~StepHooks.step_failed` (an
out-of-memory error gets its snapshot and record before the caller re-raises it, unchanged);
``with writer.monitored_step(step):`` is the two in one ``with`` block. A loop that would rather
not call ``log_memory`` on steps with nothing due calls :meth:`~StepHooks.begin_step` at the start
of each step: it notes the step and says whether ``log_memory`` is due. These run at every step,
inside the training loop: each does as little as it can when nothing is due.

Deprecated, with a warning naming the replacement: ``next_due`` (use :meth:`~StepHooks.begin_step`'s
result) and ``handle_oom`` (use :meth:`~StepHooks.step_failed`).

They stand on the record pipeline (:mod:`tbmem._internal._writer_record`); :mod:`tbmem._internal.writer`'s lifecycle
stands on them. ``_save_oom`` is the one place the out-of-memory record is assembled.

Example:
    >>> import tempfile
    >>> from tbmem import MemoryWriter
    >>> with MemoryWriter(tempfile.mkdtemp(), every=5, census_every=0) as w:
    ...     [w.begin_step(step) for step in range(6)], [w.log_memory(step) for step in range(6)]
    ([True, False, False, False, False, True], [True, False, False, False, False, True])
"""

from __future__ import annotations

import contextlib
import warnings
from typing import TYPE_CHECKING, Any, Sequence

from tbmem._internal import _torch_private as tp
from tbmem._internal._log import logger, oom_line, report_once
from tbmem._internal._writer_components import StepCall
from tbmem._internal._writer_record import RecordPipeline
from tbmem._internal.oom.census import take_at_oom as take_oom_census
from tbmem._internal.oom.runtime import report as explain_oom

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["StepHooks"]


class StepHooks(RecordPipeline):
    """The per-step calls of :class:`tbmem.MemoryWriter`, and its out-of-memory record."""

    def log_memory(self, step: int, *, roots: Sequence[torch.Tensor] = (), force: bool = False,
                   where: str | None = None) -> bool:
        """Log the step's memory: the one call per training step. Returns whether anything was written.

        Nothing is written on a step that is not due (``every``, ``census_every``, a snapshot or
        profile window); the call then costs well under a microsecond.

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
        parts = self._components
        for component in parts.each_step:  # ranks, snapshots: only those configured
            try:
                component.on_step(step)
            except Exception as exc:  # noqa: BLE001 - monitoring must never break training
                self._component_failed(component, exc)
        if not self._active:  # only the ranks can be here: every rank joins the record's collective
            for component in parts.on_due:
                component.on_due(StepCall(step, record=True))
            return False
        last = self._last_step  # self._saw(step), inline: this runs at every step
        if last is None or step > last:
            self._last_step = step
        woke = step >= parts.wake_at  # one comparison outside profile windows
        census_every = self._census_every
        record = force or step % self.config.every == 0
        census = census_every > 0 and step % census_every == 0
        if not (record or census or woke):
            return False
        call = StepCall(step, roots=roots, where=where, record=record, census=census, woke=woke)
        for component in parts.on_due:  # in order: profile windows, probes, ranks, alerts, census, windows
            try:
                component.on_due(call)
            except Exception as exc:  # noqa: BLE001 - monitoring must never break training
                self._component_failed(component, exc)
        if woke:
            parts.rewake()
        # an event written on this thread is in the file; a staged run is read by nobody before close
        if self._tensorboard.needs_flush and self.config.flush_each_record and not self.closed:
            self.flush()
        return call.record or call.census

    def begin_step(self, step: int) -> bool:
        """A training step begins: note it, and say whether :meth:`log_memory` has anything to do at it.

        It becomes the last step (the one a snapshot of another rank's out-of-memory error names), and
        a profile window due at ``step`` opens here. A loop that calls this at the start of every step
        may skip ``log_memory`` where it returns False (the trainers do: a call costs microseconds
        inside a training step, where the caches are cold); it is True at every step while snapshots,
        ranks or a closed writer need every call.
        """
        if self.closed:
            return True
        parts = self._components
        for component in parts.on_begin:  # ranks, profile windows: only those configured
            try:
                component.on_begin(step)
            except Exception as exc:  # noqa: BLE001 - monitoring must never break training
                self._component_failed(component, exc)
        last = self._last_step
        if last is None or step > last:
            self._last_step = step
        if step >= parts.wake_at:
            parts.rewake()
        return self._due(step)

    def _due(self, step: int) -> bool:
        parts = self._components
        if not self._active or parts.each_step or step >= parts.wake_at or step % self.config.every == 0:
            return True
        census_every = self._census_every
        return census_every > 0 and step % census_every == 0

    def next_due(self, step: int) -> int:
        """Deprecated: call :meth:`begin_step` at each step; it says whether :meth:`log_memory` is due."""
        warnings.warn("MemoryWriter.next_due is deprecated; call begin_step(step) at each step: it returns "
                      "whether log_memory(step) is due", DeprecationWarning, stacklevel=2)
        if self.closed or not self._active or self._components.each_step:
            return step
        every = self.config.every
        due = -(-step // every) * every
        if self._census_every > 0:
            due = min(due, -(-step // self._census_every) * self._census_every)
        return min(due, max(step, self._components.wake_at))

    def monitored_step(self, step: int, *, log: bool = True) -> contextlib.AbstractContextManager[None]:
        """``begin_step``, ``log_memory`` after the step and ``step_failed`` on an exception, as one
        ``with`` block: an out-of-memory error gets its snapshot and record, and the original exception
        goes on unchanged.

        Args:
            step: The global step.
            log: False when the step calls ``log_memory(step, roots=...)`` itself (mid-step, so
                the census sees the activations); the OOM handling stays.
        """
        return _MonitoredStep(self, step, log)

    def step_failed(self, step: int, exc: BaseException) -> None:
        """``exc`` is leaving training step ``step``: an out-of-memory error gets its snapshot and record
        (saved, said in one line), any other the events flushed. Never raises; the caller re-raises ``exc``
        (the same object: nothing of tbmem is chained to it).

        A ``try``/``except`` in the loop costs nothing until something is raised (Python 3.11+),
        where a context manager is two calls per step::

            try:
                loss = train_step(batch)
            except BaseException as exc:
                writer.step_failed(step, exc)
                raise
        """
        if isinstance(exc, tp.OutOfMemoryError):
            self._handle_oom(step, exc)
        else:
            self._flush_quietly()

    def handle_oom(self, step: int, exc: BaseException) -> None:
        """Deprecated: :meth:`step_failed` saves what an out-of-memory error needs."""
        warnings.warn("MemoryWriter.handle_oom is deprecated; use step_failed(step, exc), which saves the "
                      "snapshot and record of an out-of-memory error", DeprecationWarning, stacklevel=2)
        self._handle_oom(step, exc)

    # --- the out-of-memory record: the one place it is assembled ----------------------------
    def _handle_oom(self, step: int, exc: BaseException) -> None:
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
        census: dict[str, Any] | None = None
        if self._active and not self.closed:
            parts = self._components
            # issue 38: live memory by category, from a census (host memory only), before the snapshot records it
            if any(c.name == "census" for c in parts.all):
                census = take_oom_census(self.watched_models, self.watched_optimizers, self.config.device)
            for component in parts.on_oom:  # the profile window's trace, the snapshot: only those configured
                try:
                    written, error = component.on_oom(step, exc, census)
                except Exception as err:  # noqa: BLE001 - the OOM must reach the user, not this
                    self._component_failed(component, err)
                    continue
                paths += written
                snap_error = snap_error or error
            parts.rewake()
            try:
                self._write_readings(self._record.read(step), step)
            except Exception as err:  # noqa: BLE001
                report_once("writer:oom-record", "tbmem: could not write the record at the OOM", exc=err)
        self._flush_quietly()
        # issue 38: the OOM explained in numbers, in the same one stderr block and the run's text tab
        explained = explain_oom(self._emit, step, exc, census=census) if self._active else ""
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
