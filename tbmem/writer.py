"""MemoryWriter: a SummaryWriter wrapper that logs memory readings every N steps.

Every call a training loop makes on a ``torch.utils.tensorboard.SummaryWriter``
(``add_scalar``, ``add_histogram``, ``flush``, ...) works unchanged on a
MemoryWriter; ``log_memory(step)`` adds the readings of the probes, the tensor
census and the snapshots on the steps they are due. All scalars of one record
are written as one event (one ``Summary`` with many values).

Example:
    >>> import tempfile, torch
    >>> from tbmem import MemoryWriter
    >>> model = torch.nn.Linear(4, 2)
    >>> with MemoryWriter(tempfile.mkdtemp(), every=2) as writer:
    ...     _ = writer.watch(model)
    ...     for step in range(4):
    ...         writer.add_scalar("Loss/train", 1.0 / (step + 1), step)
    ...         _ = writer.log_memory(step)
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
import weakref
from typing import Any, Iterable, Mapping, Sequence

import torch
from torch.utils.tensorboard import SummaryWriter

from tbmem import _process, _signals
from tbmem import _torch_private as tp
from tbmem._direct_events import DirectEvents, make_event
from tbmem._extras import MissingExtraError
from tbmem._fastcrc import install as install_fast_crc
from tbmem._large import LargeThreshold
from tbmem._log import logger, oom_line, report_once
from tbmem._safe_io import FaultLedger, describe, guard_forwarded
from tbmem._safe_io import install as install_safe_io
from tbmem.config import MemoryWriterConfig, unknown_keys
from tbmem.layout import LayoutTracker
from tbmem.probes import CudaProbe, HostProbe, NvmlProbe, Probe, ProcessTreeProbe
from tbmem.probes.guard import ProbeGuard
from tbmem.ranks.support import RankSupport
from tbmem.tags import TAGS

__all__ = ["MemoryWriter"]

_CENSUS_TEXT_TAG = TAGS["census_text"].tag
# SummaryWriter methods that write: guarded (never raise an I/O error) and no-ops after close().
_WRITE_PREFIX = "add_"


class MemoryWriter:
    """A ``SummaryWriter`` that also logs memory.

    Args:
        log_dir: Where event files go (created if missing; a relative path is resolved once, here,
            so an ``os.chdir`` later moves nothing). None: ``runs/<date>_<host>``, as SummaryWriter
            picks it. Mutually exclusive with ``writer``.
        writer: An existing SummaryWriter to wrap instead of creating one.
        config: A :class:`MemoryWriterConfig`; or pass its fields as keywords.
        **options: Fields of :class:`MemoryWriterConfig` (``every=10``, ``census_every=500``, ...).

    Raises:
        ValueError: a configuration value is invalid (the message names the field).
        OSError: ``log_dir`` cannot be created or written.

    Faults (docs/reliability.md): a full or read-only disk never raises into training
    (events are dropped, counted, reported at close, and writing is retried); a probe
    that fails is retried with backoff and switched off after 5 failures in a row
    (:class:`tbmem.probes.guard.ProbeGuard`); writes after :meth:`close` are ignored with
    one warning; on SIGTERM the writer flushes, writes a final record and closes before
    the process ends.
    """

    def __init__(
        self,
        log_dir: str | os.PathLike[str] | None = None,
        *,
        writer: SummaryWriter | None = None,
        config: MemoryWriterConfig | None = None,
        **options: Any,
    ) -> None:
        if config is not None and options:
            raise TypeError("pass either config= or config fields as keywords, not both")
        if writer is not None and log_dir is not None:
            raise ValueError("pass either log_dir= or writer=, not both")
        problem = unknown_keys(MemoryWriterConfig, options) if config is None else None
        if problem:
            raise TypeError(f"MemoryWriter(): {problem}")
        self.config = config if config is not None else MemoryWriterConfig(**options)
        if self.config.fast_crc:
            install_fast_crc()
        # Under torch.distributed each rank writes <log_dir>/rank<r> (docs/distributed.md).
        self._ranks = RankSupport.create(self.config)
        if writer is None:
            if self._ranks is not None:
                log_dir = self._ranks.run_dir(os.fspath(log_dir) if log_dir is not None else _job_dir())
            # resolved once: after an os.chdir a relative logdir would name another folder
            log_dir = os.path.abspath(os.fspath(log_dir) if log_dir is not None else _default_dir())
            _check_writable(log_dir)
            writer = SummaryWriter(log_dir)
        self._writer = writer
        self._log_dir = os.path.abspath(str(writer.get_logdir()))
        self.closed = False
        self._last_step: int | None = None
        # A full or read-only disk must not end the run: errors in TensorBoard's writer thread are
        # caught where they surface, counted here and reported once (tbmem._safe_io).
        self._faults = FaultLedger(self._log_dir)
        install_safe_io(writer, self._faults)
        # the writer's own events, encoded by hand: written on this thread where records are flushed at
        # once (no hand-over to TensorBoard's writer thread: tbmem._direct_events), else queued
        self._events = DirectEvents(writer)
        self._direct = self._events if self.config.flush_each_record else None
        self._probe_guard = ProbeGuard()
        self._models: list[weakref.ref[torch.nn.Module]] = []
        self._optimizers: list[weakref.ref[torch.optim.Optimizer]] = []
        self._probes: list[Probe] = []
        self._census_on = False
        self._layout: LayoutTracker | None = None
        self._stop_capture: Any = None
        self._snapshots: Any = None
        self._alerts: Any = None
        self._last_record: tuple[float, int] | None = None
        self._large = LargeThreshold(self.config.large_tensor_mb)
        self._active = self.config.enabled
        if self._active:
            self._setup()
        # Flush at interpreter exit (an unhandled exception ends the run without close()) and finish
        # on SIGTERM, in this process only: a forked child inherits the writer closed (tbmem._process)
        self._at_exit = _process.adopt(self)

    def _setup(self) -> None:
        cfg = self.config
        makers: list[tuple[str, Any]] = [
            ("host", lambda: HostProbe(peak_mode=cfg.peak_mode, uss=cfg.uss, system_every_s=cfg.system_every_s)),
            ("process_tree", ProcessTreeProbe),
            ("cuda", lambda: CudaProbe(device=cfg.device, peak_mode=cfg.peak_mode))]
        if cfg.nvml:
            makers.append(("nvml", lambda: NvmlProbe(device=cfg.device or 0)))
        for name, make in makers:
            try:
                self._probes.append(make())
            except MissingExtraError:
                raise  # a configuration error (nvml=True without nvidia-ml-py), not a fault
            except Exception as exc:  # noqa: BLE001 - e.g. psutil.AccessDenied in a container
                report_once(f"probe:{name}", f"tbmem: the {name} probe could not be created and is switched "
                            f"off ({type(exc).__name__}: {exc})")
        for probe in list(self._probes):
            self._guard(probe, probe.start)
        self._census_on = cfg.census_every > 0
        if self._census_on:
            from tbmem.census import heap

            # Lets censuses after the first scan only what is new (see tbmem.census.heap); undone on
            # close, when the census is switched off, or when the writer is collected unclosed.
            heap.start_capture()
            self._stop_capture = weakref.finalize(self, heap.stop_capture)
        ranks = self._ranks
        # the custom-scalars layout follows what the run writes (tbmem.layout): see write_scalars
        self._layout = LayoutTracker() if cfg.custom_layout else None
        if cfg.snapshot is not None and getattr(cfg.snapshot, "enabled", True):
            from tbmem.snapshot import SnapshotManager

            snapshot = ranks.snapshot_config(cfg.snapshot) if ranks is not None else cfg.snapshot
            self._snapshots = SnapshotManager(snapshot, log_dir=self.log_dir, writer=self)
        if ranks is not None:
            ranks.attach(write=self.write_scalars, snapshots=lambda: self._snapshots, flush=self.flush)
        if cfg.alerts is not None:
            self._setup_alerts(cfg.alerts)

    def _setup_alerts(self, alerts: Any) -> None:
        from tbmem.alerts import AlertMonitor

        if alerts.snapshot and self._snapshots is None:
            from tbmem.snapshot import SnapshotConfig, SnapshotManager

            # no schedule: only the snapshots alerts (and an out-of-memory error) ask for
            base = SnapshotConfig(recorder="off")
            snapshot = self._ranks.snapshot_config(base) if self._ranks is not None else base
            self._snapshots = SnapshotManager(snapshot, log_dir=self.log_dir, writer=self)
        self._alerts = AlertMonitor(alerts, writer=self, snapshot=lambda step: (
            self._snapshots.snapshot_now(step) if self._snapshots is not None else []))

    # --- SummaryWriter compatibility -----------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        # Only called for attributes MemoryWriter lacks: forward to the wrapped writer.
        inner = self.__dict__.get("_writer")
        if inner is None:
            raise AttributeError(name)
        attr = getattr(inner, name)
        if name.startswith(_WRITE_PREFIX) and callable(attr):
            # ignored after close(); an I/O error counted instead of raised
            return guard_forwarded(self, name, attr)
        return attr

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
        """The wrapped ``SummaryWriter``."""
        return self._writer

    @property
    def log_dir(self) -> str:
        """The directory the event files are written to (absolute: resolved when the writer opened)."""
        return self._log_dir

    # --- registration -------------------------------------------------------------------
    def watch(self, *objects: torch.nn.Module | torch.optim.Optimizer) -> "MemoryWriter":
        """Register models and optimizers whose tensors the census names.

        Held through weak references: watching does not keep a model alive.
        """
        for obj in objects:
            if isinstance(obj, torch.nn.Module):
                self._models.append(weakref.ref(obj))
            elif isinstance(obj, torch.optim.Optimizer):
                self._optimizers.append(weakref.ref(obj))
            else:
                raise TypeError(f"watch() takes nn.Module or Optimizer objects, got {type(obj).__name__}")
        return self

    @property
    def watched_models(self) -> list[torch.nn.Module]:
        """The watched models still alive."""
        return [m for m in (r() for r in self._models) if m is not None]

    @property
    def watched_optimizers(self) -> list[torch.optim.Optimizer]:
        """The watched optimizers still alive."""
        return [o for o in (r() for r in self._optimizers) if o is not None]

    # --- writing ------------------------------------------------------------------------
    def write_scalars(self, values: Mapping[str, float], step: int, walltime: float | None = None) -> None:
        """Write many scalars as one event: one ``Summary`` with a value per tag.

        With ``flush_each_record`` (the default) the event is written on the calling thread
        (tbmem._direct_events): the next record waits for every queued event anyway, and handing
        an event to TensorBoard's writer thread costs the training thread about twice as much
        (the thread's wake-up and the hand-over of the GIL, measured in a training loop).
        """
        self._write_event(values, step, walltime)

    def _write_event(self, values: Mapping[str, float], step: int, walltime: float | None = None) -> bool:
        """:meth:`write_scalars`; True when the event was written to the file on this thread."""
        if self.closed:
            self._after_close("write_scalars")
            return False
        if not values:
            return False
        self._saw(step)
        if self._layout is not None:  # queued before the event, so written before it
            self._update_layout(values)
        events = self._events
        try:
            if self._direct is not None and events.write(values, step, walltime):
                return True
            if not events.queue(values, step, walltime):  # what add_summary would queue
                event = make_event(values, step, walltime)
                self._writer._get_file_writer().add_event(event, step, event.wall_time)
        except OSError as exc:  # only where tbmem._safe_io could not guard the writer thread
            self._faults.failed(self.log_dir, exc, events=1)
        return False

    def _update_layout(self, values: Mapping[str, float]) -> None:
        try:
            layout = self._layout.see(values)
            if layout is not None:
                self._writer.add_custom_scalars(layout)
        except Exception as exc:  # noqa: BLE001 - a chart layout is never worth a training run
            report_once("writer:layout", "tbmem: writing the custom-scalars layout failed; it is off", exc=exc)
            self._layout = None

    def write_readings(self, readings: Mapping[str, float], step: int) -> None:
        """Write raw readings keyed by tag-table keys, converted to their tags' units."""
        self.write_scalars(_tagged(readings), step)

    def _write_record(self, readings: Mapping[str, float], step: int) -> bool:
        """A memory record: one event of the readings in their tags' units (written on this
        thread when records are flushed at once: :meth:`write_scalars`); True when it was."""
        return self._write_event(_tagged(readings), step)

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
        ranks = self._ranks
        if ranks is not None:
            ranks.on_log(step)
        if not self._active:
            if ranks is not None:  # every rank joins the record's collective, monitoring on or off
                ranks.on_record(step, None)
            return False
        last = self._last_step  # self._saw(step), inline: this runs at every step
        if last is None or step > last:
            self._last_step = step
        if self._snapshots is not None:
            self._call_snapshots("on_step", step)
        cfg = self.config
        due = force or step % cfg.every == 0
        census_due = self._census_on and step % cfg.census_every == 0
        if not (due or census_due):
            return False
        written = False  # on this thread, after every event queued before it
        if due:
            readings = self._read(step)
            if ranks is not None:
                ranks.on_record(step, readings)
            written = self._write_record(readings, step) and ranks is None
            if self._alerts is not None:
                written = False  # an alert may queue events of its own: flushed below
                if not self._guard_call("alerts", self._alerts.on_record, step, readings):
                    self._alerts = None
        if census_due and not self._take_census(step, roots, where or "where the training loop called log_memory"):
            written = False  # its table was queued: flushed below
        if cfg.flush_each_record and not written:  # a record written on this thread is in the file
            self.flush()
        return True

    def next_due(self, step: int) -> int:
        """The first step from ``step`` on at which :meth:`log_memory` does more than note the step.

        It is ``step`` itself while snapshots, ranks or a closed writer need every call. A loop
        that skips the calls in between must call :meth:`begin_step` at each step instead (the
        trainers do: a call costs microseconds inside a training step, where the caches are cold).
        """
        if self.closed or not self._active or self._ranks is not None or self._snapshots is not None:
            return step
        cfg = self.config
        due = -(-step // cfg.every) * cfg.every
        if self._census_on:
            due = min(due, -(-step // cfg.census_every) * cfg.census_every)
        return due

    def _read(self, step: int) -> dict[str, float]:
        readings: dict[str, float] = {}
        probes, call = self._probes, self._probe_guard.call  # self._guard, inline
        for probe in list(probes):
            result = call(probes, probe, probe.read)
            if result:
                readings.update(result)
        now = time.perf_counter()
        if self._last_record is not None and step > self._last_record[1]:
            readings["step_time"] = (now - self._last_record[0]) / (step - self._last_record[1])
        self._last_record = (now, step)
        return readings

    def _take_census(self, step: int, roots: Iterable[torch.Tensor], where: str) -> bool:
        """Take a census and write it; True when its events were written on this thread (nothing
        of it is left in TensorBoard's queue)."""
        cfg = self.config
        direct = [False]

        def run() -> None:
            import dataclasses

            from tbmem.census import take_census
            from tbmem.logdir.census_log import append_census

            census = take_census(
                models=self.watched_models, optimizers=self.watched_optimizers, roots=tuple(roots),
                top_k=cfg.top_k, device=cfg.device,
            )
            census = dataclasses.replace(self._large.apply(census), where=where)
            direct[0] = self._write_event(census.scalars(), step)
            direct[0] = self._write_text(_CENSUS_TEXT_TAG, census.to_markdown(), step) and direct[0]
            # every census, exact, for the Memory tab; a full disk is counted like the other writes
            append_census(self.log_dir, step, census,
                          on_os_error=lambda where, exc: self._faults.failed(where, exc, census_lines=1))

        if not self._guard_call("census", run):
            self._census_on = False
            self._stop_capture()
            return False
        return direct[0]

    def _write_text(self, tag: str, text: str, step: int) -> bool:
        """``add_text``, written on this thread where :meth:`write_scalars` writes there (the same
        event bytes: a text ``Summary`` in an ``Event``); True when it was."""
        if self._direct is not None:
            from tensorboard.compat.proto.event_pb2 import Event
            from torch.utils.tensorboard.summary import text as text_summary

            event = Event(wall_time=time.time(), step=int(step), summary=text_summary(tag, text))
            try:
                if self._events.write_encoded(event.SerializeToString()):
                    self._saw(step)
                    return True
            except OSError as exc:  # only where tbmem._safe_io could not guard the writer thread
                self._faults.failed(self.log_dir, exc, events=1)
                return False
        self._writer.add_text(tag, text, step)
        return False

    def _guard(self, probe: Probe, fn: Any) -> Any:
        """Run a probe call; a failure is retried with backoff, then switches the probe off."""
        return self._probe_guard.call(self._probes, probe, fn)

    def _guard_call(self, what: str, fn: Any, *args: Any) -> bool:
        try:
            fn(*args)
            return True
        except Exception as exc:  # noqa: BLE001 - monitoring must never break training
            report_once(f"writer:{what}", f"tbmem: {what} failed and is switched off", exc=exc)
            return False

    def _call_snapshots(self, method: str, *args: Any) -> None:
        """Call the snapshot manager; a failure switches snapshots off."""
        if not self._guard_call("snapshots", getattr(self._snapshots, method), *args):
            self._snapshots = None

    # --- monitored steps and out-of-memory ------------------------------------------------
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
        ranks = self._ranks
        if ranks is not None:
            ranks.last_step = step
        last = self._last_step
        if last is None or step > last:
            self._last_step = step

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
        logger.error("%s", oom_line(step, exc, paths, snap_error))
        if self._ranks is not None:  # after this rank's snapshot: the other ranks write theirs
            self._ranks.on_oom(step)

    # --- lifecycle ----------------------------------------------------------------------
    def flush(self) -> None:
        """Flush pending events to disk (never raises an I/O error: see docs/reliability.md)."""
        if not self.closed:
            try:
                self._writer.flush()
            except OSError as exc:  # only where tbmem._safe_io could not guard the writer thread
                self._faults.failed(self.log_dir, exc)

    def _flush_quietly(self) -> None:
        try:
            self.flush()
        except Exception as exc:  # noqa: BLE001 - an exception on its way to the user goes first
            report_once("writer:flush", "tbmem: flushing the event files failed", exc=exc)

    def close(self) -> None:
        """Finish snapshots, stop the probes, flush and close the event files.

        Never raises an I/O error; what could not be written is reported in one line.
        """
        if self.closed:
            _release_recorders()  # a second close() on the recording's own thread removes its mode
            return
        try:
            if self._ranks is not None:
                self._ranks.close()
            if self._snapshots is not None:
                self._call_snapshots("close")
            for probe in self._probes:
                self._guard(probe, probe.stop)
            if self._stop_capture is not None:
                self._stop_capture()
            self._flush_quietly()
            try:
                self._writer.close()
            except OSError as exc:
                self._faults.failed(self.log_dir, exc)
        finally:
            self.closed = True
            _process.release(self, self._at_exit)
            _release_recorders()
        self._faults.report_close()

    def _finish(self, reason: str) -> None:
        """On SIGTERM: flush, write a final record at the last step seen, close (tbmem._signals)."""
        _signals.finish_writer(self, reason)

    def __enter__(self) -> "MemoryWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _MonitoredStep:
    """What :meth:`MemoryWriter.monitored_step` returns: a plain context manager, not a generator,
    because it wraps every training step (a generator-based one costs several times as much),
    and an exception leaves it as it came in, with no frame of tbmem added to its traceback."""

    __slots__ = ("writer", "step", "log")

    def __init__(self, writer: MemoryWriter, step: int, log: bool) -> None:
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


# key -> (tag, scale) in a plain dict: TAGS is a read-only proxy, and a record looks up a dozen keys
_UNITS: dict[str, tuple[str, float]] = {key: (row.tag, row.scale) for key, row in TAGS.items()}


def _tagged(readings: Mapping[str, float]) -> dict[str, float]:
    """Raw readings keyed by tag-table keys as ``{tag: value in the tag's unit}``."""
    units = _UNITS
    tagged = {}
    for key, value in readings.items():
        tag, scale = units[key]
        tagged[tag] = float(value) / scale
    return tagged


def _job_dir() -> str:
    """``runs/<job>``: one folder for every rank of a job started without a log_dir."""
    job = os.environ.get("TORCHELASTIC_RUN_ID") or time.strftime("%b%d_%H-%M-%S")
    return os.path.join("runs", f"job_{job}")


def _default_dir() -> str:
    """SummaryWriter's default, ``runs/<date>_<host>``."""
    import socket

    return os.path.join("runs", time.strftime("%b%d_%H-%M-%S") + "_" + socket.gethostname())


def _release_recorders() -> None:
    """Remove snapshot recording modes stopped from another thread that this thread still holds."""
    recorder = sys.modules.get("tbmem.snapshot.recorder")
    release = getattr(recorder, "release_detached", None)
    if release is not None:
        try:
            release()
        except Exception as exc:  # noqa: BLE001
            report_once("writer:release-recorder", "tbmem: could not remove a stopped recorder", exc=exc)


def _check_writable(log_dir: str) -> None:
    try:
        os.makedirs(log_dir, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=log_dir, prefix=".tbmem-write-test-"):
            pass
    except OSError as exc:
        # one message, no chained traceback: what the user must fix is the folder, not tbmem
        raise type(exc)(exc.errno, f"MemoryWriter cannot write event files to log_dir {log_dir!r}: "
                                   f"{exc.strerror or exc}") from None
