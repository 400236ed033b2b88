"""Profile windows: ``torch.profiler`` over K steps every N steps, with tbmem's tracks merged into the trace.

:class:`ProfileWindows` is driven by :class:`tbmem.MemoryWriter`'s step hooks. A window for steps
``[s, s + K)`` opens at the end of step ``s - 1`` (its ``log_memory``) or, for a loop that calls
``begin_step``, at the start of step ``s``; while it is open every ``log_memory`` writes a record
(and a census, with :attr:`~tbmem.ProfileConfig.census`), every scalar event the writer
writes is kept with its time, and the window is a recorder of :mod:`tbmem._internal.snapshot.markers`, so the
trainers' step and phase marks reach it. The window closes after the record of step ``s + K - 1``;
its trace (:mod:`tbmem._internal.profile.merge`) is written then. Outside windows the writer compares one
integer per hook call.

A window that fails (torch.profiler unavailable, a full disk) is reported once
(:func:`tbmem.report_once`), profiling is switched off and training goes on.

Example:
    >>> import tempfile, torch
    >>> from tbmem import MemoryWriter
    >>> from tbmem._internal.logdir.traces import list_traces
    >>> model = torch.nn.Linear(8, 8)
    >>> with MemoryWriter(tempfile.mkdtemp(), every=100, census_every=0,
    ...                   profile={"every": 4, "steps": 2, "start": 4}) as w:
    ...     for step in range(8):
    ...         _ = model(torch.randn(4, 8)).sum().backward()
    ...         _ = w.log_memory(step)
    >>> [t["step"] for t in list_traces(w.log_dir)]
    [4]
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping

from tbmem._internal._log import report_once
from tbmem._internal.profile.config import ProfileConfig

__all__ = ["ProfileWindows", "NEVER"]

#: A step no run reaches: no window is due.
NEVER = 2**62
_CLOCK_EVENT = "tbmem::clock_sync"


class _Window:
    """One open window: the profiler and what tbmem saw while it ran (times in perf_counter ns)."""

    def __init__(self, first: int, config: ProfileConfig, device_index: int | None) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile

        from tbmem._internal.snapshot import markers

        self.first, self.last = first, first + config.steps - 1
        activities = [ProfilerActivity.CPU]
        if config.cuda and torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self.cuda = len(activities) > 1
        self.prof = profile(activities=activities, record_shapes=config.record_shapes,
                            profile_memory=config.profile_memory, with_stack=config.with_stack)
        self.samples: list[tuple[int, int, dict[str, float]]] = []  # (ns, step, scalars written)
        self.marks: list[tuple[int, str, str]] = []  # (ns, label, kind)
        self.instants: list[tuple[int, str, dict[str, Any]]] = []
        self.records: dict[int, tuple[int, int]] = {}  # step -> (log_memory entered, left)
        self.begins: dict[int, int] = {}
        self.before: int | None = None  # when log_memory of the step before the window returned
        self.alerts_seen = 0
        self.syncs: list[tuple[int, int]] = []
        self.external: list[tuple[str, list[dict[str, Any]]]] = []  # (source, perf_counter-us events)
        self.prof.start()
        self.opened = time.perf_counter_ns()
        self._sync()
        self._markers = markers
        markers.register(self)

    def _sync(self) -> None:
        """A named profiler event between two perf_counter readings: how the two clocks align."""
        from torch.profiler import record_function

        before = time.perf_counter_ns()
        with record_function(_CLOCK_EVENT):
            pass
        self.syncs.append((before, time.perf_counter_ns()))

    def mark(self, label: str, *, kind: str = "step") -> None:
        """A step or phase mark from :func:`tbmem.mark_snapshot` (the trainers' hooks)."""
        self.marks.append((time.perf_counter_ns(), label, kind))

    def stop(self) -> Any:
        """Stop the profiler; returns it (its events are read once, by the trace merge)."""
        self._markers.unregister(self)
        self._sync()
        self.closed = time.perf_counter_ns()
        self.prof.stop()
        return self.prof


class ProfileWindows:
    """The profile windows of one writer (see the module docstring).

    Args:
        config: When windows open and what the profiler records.
        log_dir: The run's directory; traces go to its ``plugins/tbmem/``.
        rank: The rank in the trace's file name.
        device_index: The CUDA device the writer reads, or None.
        alerts: Returns the memory alerts fired so far; those fired in a window are instants in its trace.
        on_written: Called with each trace's path once it is written (the writer sends it to its sinks).
    """

    def __init__(self, config: ProfileConfig, *, log_dir: str, rank: int = 0, device_index: int | None = None,
                 alerts: Callable[[], list[Any]] = list,
                 on_written: Callable[[str], None] | None = None) -> None:
        self.config, self.log_dir, self.rank, self.device_index = config, log_dir, rank, device_index
        self._alerts = alerts  # the alerts fired so far (tbmem._internal.alerts.AlertMonitor.fired): instants
        self._on_written = on_written
        self.window: _Window | None = None
        self.next_start = config.first_window(0)
        self.written: list[str] = []
        self.last_profiler: Any = None  # the last window's torch.profiler.profile (key_averages())
        self.off = not config.enabled
        self.count = 0

    @property
    def at(self) -> int:
        """The writer's threshold: a hook at a step >= this calls in (-1 while a window is open)."""
        if self.window is not None:
            return -1
        if self.off or (self.config.max_windows and self.count >= self.config.max_windows):
            return NEVER
        return max(self.next_start - 1, 0)

    # --- the writer's hooks -----------------------------------------------------------------
    def begin(self, step: int) -> None:
        """Step ``step`` starts: open its window if one starts here; note the time."""
        if self.window is None and step >= self.next_start:
            self._open(step)
        if self.window is not None:
            self.window.begins[step] = time.perf_counter_ns()

    def enter(self, step: int) -> bool:
        """``log_memory(step)`` starts: whether ``step`` is inside the open window (a record is due)."""
        w = self.window
        if w is None:
            self._maybe_open(step)
            return False
        if step >= w.first:
            w.records[step] = (time.perf_counter_ns(), 0)
            return True
        return False

    def leave(self, step: int) -> None:
        """``log_memory(step)`` is done: close the window after its last step."""
        w = self.window
        if w is None:
            return
        fired = self._alerts()
        for alert in fired[w.alerts_seen:]:  # checked in this step's record
            self.instant("memory alert", step=step, kind=str(alert.kind), message=str(alert.message))
        w.alerts_seen = len(fired)
        if step in w.records:
            w.records[step] = (w.records[step][0], time.perf_counter_ns())
        elif step < w.first:  # the record of the step before the window: the window's first step starts now
            w.before = time.perf_counter_ns()
        if step >= w.last:
            self.close()
            self._maybe_open(step)  # a window right after this one (steps == every)

    def _maybe_open(self, step: int) -> None:
        """At the end of step ``step``: open the window that starts at the next step, if one does."""
        if self.at != NEVER and step + 1 >= self.next_start:
            self._open(max(step + 1, self.next_start))

    def on_scalars(self, step: int, values: Mapping[str, float]) -> None:
        """An event the writer wrote while the window is open."""
        if self.window is not None:
            self.window.samples.append((time.perf_counter_ns(), step, dict(values)))

    def add_perf_counter_events(self, events: list[dict[str, Any]], *, source: str) -> None:
        """Trace events stamped with ``time.perf_counter`` microseconds (PhiML's profiler: its ``pid`` 0 the
        Python calls, 1 the backend operations), for the open window's trace under processes named
        ``<source> ...``; each complete event gets the bytes torch.profiler saw allocated during it."""
        if self.window is not None:
            self.window.external.append((source, events))

    def instant(self, name: str, **args: Any) -> None:
        """A moment in the open window's trace (an out-of-memory error, a snapshot)."""
        if self.window is not None:
            self.window.instants.append((time.perf_counter_ns(), name, args))

    def close(self) -> None:
        """Close the open window, if any, and write its trace; never raises."""
        w, self.window = self.window, None
        if w is None:
            return
        try:
            prof = w.stop()
            if not w.records:  # opened at the end of a step after which the run ended: no step to show
                return
            self.last_profiler = prof
            from tbmem._internal.profile.merge import window_trace
            from tbmem._internal.ranks.context import detect_rank

            info = detect_rank()  # the job's size for distributedInfo (HTA and torch-tb-profiler read it)
            world = info.world_size if info.rank == self.rank else None  # a rank given by hand: size unknown
            self._write(w, window_trace(w, prof, rank=self.rank, config=self.config, world_size=world))
        except Exception as exc:  # noqa: BLE001 - a profile window must never end training
            self._failed("writing a profile window's trace", exc)

    # --- helpers ------------------------------------------------------------------------------
    def _open(self, first: int) -> None:
        from tbmem._internal import _torch_private as tp

        self.count += 1
        self.next_start = self.config.first_window(first + self.config.every)
        if tp.profiler_running():  # the user's own profiler: stopping ours would end theirs
            report_once(f"profile:busy:{self.log_dir}", f"tbmem: the profile window at step {first} is skipped: "
                        "another torch.profiler is running (later windows are tried again)")
            return
        try:
            self.window = _Window(first, self.config, self.device_index)
            self.window.alerts_seen = len(self._alerts())
        except Exception as exc:  # noqa: BLE001 - profiler unavailable: training goes on
            self.window = None
            self._failed("starting torch.profiler", exc)

    def _write(self, w: _Window, doc: dict[str, Any]) -> None:
        from tbmem._internal.logdir.traces import encode_trace, trace_name, write_trace

        data = encode_trace(doc)
        if len(data) > self.config.max_trace_mb * 2**20:
            report_once(f"profile:size:{self.log_dir}", f"tbmem: the profile trace of step {w.first} is "
                        f"{len(data) / 2**20:.0f} MB, over max_trace_mb; not written")
            return
        path = write_trace(self.log_dir, trace_name(rank=self.rank, step=w.first), data)
        self.written.append(path)
        if self._on_written is not None:
            self._on_written(path)

    def _failed(self, what: str, exc: BaseException) -> None:
        self.off = True
        report_once(f"profile:{self.log_dir}", f"tbmem: {what} failed; profile windows are off for this run",
                    exc=exc)
        # a profiler left running would cost every later step
        w = self.window
        self.window = None
        if w is not None:
            try:
                w.stop()
            except Exception:  # noqa: BLE001
                pass

