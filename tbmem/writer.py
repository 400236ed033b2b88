"""MemoryWriter: a SummaryWriter wrapper that logs memory readings every N steps.

Every call a training loop makes on a ``torch.utils.tensorboard.SummaryWriter``
(``add_scalar``, ``add_histogram``, ``flush``, ...) works unchanged on a
MemoryWriter; ``log_memory(step)`` adds the readings of the probes, the tensor
census and the snapshots on the steps they are due. All scalars of one record
are written as one event (one ``Summary`` with many values).

The class is split by its jobs: this module is its lifecycle and its faults (opening the run,
the probes and the components the configuration asks for, the SummaryWriter calls forwarded,
the out-of-memory record, flushing and closing); :mod:`tbmem._writer_record` is the record
pipeline (readings and censuses into events and side files); :mod:`tbmem._writer_steps` the
step hooks a training loop calls. Where the run's files go is :mod:`tbmem.logdir`'s layout.

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

import os
import sys
import tempfile
import weakref
from typing import Any

import torch
from torch.utils.tensorboard import SummaryWriter

from tbmem import _process, _signals
from tbmem._direct_events import DirectEvents
from tbmem._extras import MissingExtraError
from tbmem._fastcrc import install as install_fast_crc
from tbmem._large import LargeThreshold
from tbmem._log import logger, oom_line, report_once
from tbmem._safe_io import FaultLedger, describe, guard_forwarded, hold_events
from tbmem._safe_io import install as install_safe_io
from tbmem._writer_record import RecordPipeline
from tbmem._writer_steps import StepHooks
from tbmem.config import MemoryWriterConfig, unknown_keys
from tbmem.layout import LayoutTracker
from tbmem.logdir.fs import RemoteMirror, is_url
from tbmem.logdir.layout import default_run_dir, job_dir
from tbmem.oom.runtime import report as explain_oom
from tbmem.probes import CudaProbe, HostProbe, NvmlProbe, Probe, ProcessTreeProbe
from tbmem.probes.guard import ProbeGuard
from tbmem.ranks.support import RankSupport

__all__ = ["MemoryWriter"]

_NEVER = 2**62  # no profile window is due
_HELD_BYTES = 256 << 10  # a staged run's events reach its file in batches of this size (tbmem._safe_io.hold)
# SummaryWriter methods that write: guarded (never raise an I/O error) and no-ops after close().
_WRITE_PREFIX = "add_"


class MemoryWriter(StepHooks, RecordPipeline):
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
        self._mirror: Any = None
        if writer is None:
            if self._ranks is not None:
                log_dir = self._ranks.run_dir(os.fspath(log_dir) if log_dir is not None else job_dir())
            if is_url(log_dir):  # s3://, gs://: written locally, copied there (tbmem.logdir.fs)
                self._mirror = RemoteMirror(str(log_dir), tempfile.mkdtemp(prefix="tbmem-remote-"),
                                            every_s=float(os.environ.get("TBMEM_REMOTE_EVERY_S", "10")))
                log_dir = self._mirror.local
            # resolved once: after an os.chdir a relative logdir would name another folder
            log_dir = os.path.abspath(os.fspath(log_dir) if log_dir is not None else default_run_dir())
            _check_writable(log_dir)
            writer = SummaryWriter(log_dir)
        self._writer = writer
        self._table = self._ranks.table_sink() if self._ranks is not None else None  # compact layout
        self._log_dir = os.path.abspath(str(writer.get_logdir()))
        self.closed = False
        self._last_step: int | None = None
        # A full or read-only disk must not end the run: errors in TensorBoard's writer thread are
        # caught where they surface, counted here and reported once (tbmem._safe_io).
        self._faults = FaultLedger(self._log_dir)
        install_safe_io(writer, self._faults)
        # a rank's private run in the compact layout: read by nobody before close (then moved or deleted)
        self._staged = self._ranks is not None and self._ranks.staged and hold_events(writer, _HELD_BYTES) > 0
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
        self._spikes: Any = None
        self._sinks: Any = None  # tbmem.sinks.SinkSet: W&B, MLflow, ... beside the event file
        self._profile: Any = None  # tbmem.profile.window.ProfileWindows
        self._profile_at = _NEVER  # a step hook at a step >= this calls into the profile windows
        self._profile_census = False
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
            from tbmem.alerts import AlertMonitor

            self._alerts = AlertMonitor(cfg.alerts, writer=self,
                                        snapshot=self._snapshot_now(cfg.alerts.snapshot, "alert"))
        if cfg.sinks:  # a missing extra raises (a configuration error); a sink that fails is switched off
            from tbmem.sinks.fanout import SinkSet

            # the run's name in the trackers: the run folder's, the job folder's for rank folders
            folder = os.path.dirname(self.log_dir) if ranks is not None else self.log_dir
            self._sinks = SinkSet.open(cfg.sinks, run_name=os.path.basename(folder))
        if cfg.spikes is not None:  # sees what write_scalars and add_scalar write (tbmem.spikes)
            from tbmem.spikes import SpikeMonitor

            self._spikes = SpikeMonitor(cfg.spikes, writer=self, faults=self._faults,
                                        snapshot=self._snapshot_now(cfg.spikes.snapshot, "spike"))
        if cfg.profile is not None and cfg.profile.enabled:  # torch.profiler windows (tbmem.profile)
            from tbmem.profile.window import ProfileWindows

            self._profile = ProfileWindows(cfg.profile, log_dir=self.log_dir, device_index=cfg.device,
                                           rank=ranks.info.rank if ranks is not None else 0,
                                           alerts=lambda: self._alerts.fired if self._alerts is not None else [],
                                           on_written=lambda path: self.log_artifact(path, "trace"))
            self._profile_at = self._profile.at

    def _snapshot_now(self, wanted: bool, kind: str) -> Any:
        """``step -> paths``: a snapshot taken at once (an alert's, a spike's); a manager without a
        schedule is made when ``wanted`` and none is (only these and an out-of-memory error ask)."""
        if wanted and self._snapshots is None:
            from tbmem.snapshot import SnapshotConfig, SnapshotManager

            base = SnapshotConfig(recorder="off")
            snapshot = self._ranks.snapshot_config(base) if self._ranks is not None else base
            self._snapshots = SnapshotManager(snapshot, log_dir=self.log_dir, writer=self)
        return lambda step: self._snapshots.snapshot_now(step, kind) if self._snapshots is not None else []

    # --- SummaryWriter compatibility -----------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        # Only called for attributes MemoryWriter lacks: forward to the wrapped writer.
        inner = self.__dict__.get("_writer")
        if inner is None:
            raise AttributeError(name)
        attr = getattr(inner, name)
        if name.startswith(_WRITE_PREFIX) and callable(attr):
            # ignored after close(); an I/O error counted instead of raised
            call = guard_forwarded(self, name, attr)
            spikes = self.__dict__.get("_spikes")
            return spikes.watching(call) if spikes is not None and name == "add_scalar" else call
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
    def profile(self) -> Any:
        """The run's profile windows (:class:`tbmem.profile.window.ProfileWindows`; ``.window`` is the
        open one), or None without ``profile=``."""
        return self._profile

    @property
    def summary_writer(self) -> SummaryWriter:
        """The wrapped ``SummaryWriter``."""
        return self._writer

    @property
    def log_dir(self) -> str:
        """The directory the event files are written to (absolute: resolved when the writer opened)."""
        return self._log_dir

    def log_artifact(self, path: str, kind: str) -> None:
        """Send a file of the run (a snapshot, a trace) to the sinks (W&B, MLflow); never raises."""
        if self._sinks is not None and not self.closed:
            self._sinks.log_artifact(path, kind)

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

    # --- faults: monitoring that fails is switched off, never raised into training ---------
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

    # --- faults: the out-of-memory record ------------------------------------------------
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
        logger.error("%s", oom_line(step, exc, paths, snap_error) + explain_oom(self, step, exc))
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
            if self._profile is not None:  # a window still open: its trace, cut short
                self._profile.close()
            for probe in self._probes:
                self._guard(probe, probe.stop)
            if self._stop_capture is not None:
                self._stop_capture()
            self._flush_quietly()
            if self._sinks is not None:
                self._sinks.close()
            try:
                self._writer.close()
            except OSError as exc:
                self._faults.failed(self.log_dir, exc)
            if self._ranks is not None:  # compact layout: the rank's run joins the job if it matters
                moved = self._ranks.finish(alerted=bool(getattr(self._alerts, "fired", None)))
                self._log_dir = moved or self._log_dir
            if self._mirror is not None:  # the last round of uploads, after every file is closed
                self._mirror.close()
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
