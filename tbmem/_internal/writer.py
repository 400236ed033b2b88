"""MemoryWriter: a SummaryWriter that logs memory readings every N steps.

A MemoryWriter *is* a ``torch.utils.tensorboard.SummaryWriter`` (a subclass): every call a
training loop makes on one (``add_scalar``, ``add_histogram``, ``flush``, ...) works unchanged,
guarded (an I/O error is counted, never raised; a write after :meth:`~MemoryWriter.close` is
ignored with one line); ``log_memory(step)``, once per training step, adds the readings of the
probes, the tensor census and the snapshots on the steps they are due. All scalars of one record
are written as one event (one ``Summary`` with many values), to TensorBoard and every other sink.

The class is built in layers, each calling only what is below it: :mod:`tbmem._internal._writer_base` (the
SummaryWriter with the writer's state, declared once, its fault guards and flush),
:mod:`tbmem._internal._writer_record` (the record pipeline: readings and censuses into events and side
files), :mod:`tbmem._internal._writer_steps` (the step hooks a training loop calls, and the out-of-memory
record), and this module: the lifecycle (opening the run, its sinks with TensorBoard's event file
first, the components the configuration asks for, the SummaryWriter's write methods guarded,
closing). The components (:mod:`tbmem._internal._writer_components`: probes, census, snapshots, alerts,
spikes, profile windows, ranks) never hold the writer: they emit through a
:class:`tbmem._internal._emit.Emitter`. Where the run's files go is :mod:`tbmem._internal.logdir`'s layout.

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

import dataclasses
import functools
import os
import sys
import tempfile
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.tensorboard import SummaryWriter

from tbmem._internal import _process, _signals
from tbmem._internal._emit import Emitter
from tbmem._internal._extras import MissingExtraError
from tbmem._internal._large import LargeThreshold
from tbmem._internal._log import report_once
from tbmem._internal._safe_io import FaultLedger
from tbmem._internal._writer_components import (
    AlertsComponent,
    CensusComponent,
    Components,
    ProbesComponent,
    ProfileComponent,
    RanksComponent,
    SnapshotsComponent,
    SpikesComponent,
    StepComponent,
)
from tbmem._internal._writer_record import table_scalars
from tbmem._internal._writer_steps import StepHooks
from tbmem._internal.config import MemoryWriterConfig, unknown_keys
from tbmem._internal.logdir.fs import RemoteMirror, is_url
from tbmem._internal.logdir.layout import default_run_dir, job_dir
from tbmem._internal.probes import CudaProbe, HostProbe, NvmlProbe, ProcessTreeProbe
from tbmem._internal.probes.guard import ProbeGuard
from tbmem._internal.ranks.support import RankSupport
from tbmem._internal.sinks.fanout import SinkSet
from tbmem._internal.sinks.tensorboard import TensorBoardSink, adopt_event_files
from tbmem._internal.tags import env_loss_tags

if TYPE_CHECKING:  # pragma: no cover
    from tbmem._internal.profile.window import ProfileWindows
    from tbmem._internal.snapshot import SnapshotManager

__all__ = ["MemoryWriter"]

_HELD_BYTES = 256 << 10  # a staged run's events reach its file in batches of this size (tbmem._internal._safe_io.hold)
# SummaryWriter methods that write: guarded (never raise an I/O error) and no-ops after close().
_WRITE_PREFIX = "add_"
# what a MemoryWriter takes over from a SummaryWriter handed to it (writer=): its event files too
_ADOPTED = ("purge_step", "max_queue", "flush_secs", "filename_suffix", "default_bins")


class MemoryWriter(StepHooks):
    """A ``SummaryWriter`` that also logs memory.

    Args:
        log_dir: Where event files go (created if missing; a relative path is resolved once, here,
            so an ``os.chdir`` later moves nothing). None: ``runs/<date>_<host>``, as SummaryWriter
            picks it. Mutually exclusive with ``writer``.
        writer: An existing SummaryWriter whose log directory and open event files this writer
            takes over (both write to the same files; :meth:`close` closes them for both).
        config: A :class:`MemoryWriterConfig`; or pass its fields as keywords.
        **options: Fields of :class:`MemoryWriterConfig` (``every=10``, ``census_every=500``, ...).

    Raises:
        ValueError: a configuration value is invalid (the message names the field).
        OSError: ``log_dir`` cannot be created or written.

    Faults (docs/reliability.md): a full or read-only disk never raises into training
    (events are dropped, counted, reported at close, and writing is retried); a probe
    that fails is retried with backoff and switched off after 5 failures in a row
    (:class:`tbmem._internal.probes.guard.ProbeGuard`); writes after :meth:`close` are ignored with
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
        self.closed = False
        # Under torch.distributed each rank writes <log_dir>/rank<r> (docs/distributed.md).
        self._ranks = RankSupport.create(self.config)
        self._mirror = None
        if writer is None:
            if self._ranks is not None:
                log_dir = self._ranks.run_dir(os.fspath(log_dir) if log_dir is not None else job_dir())
            if is_url(log_dir):  # s3://, gs://: written locally, copied there (tbmem._internal.logdir.fs)
                self._mirror = RemoteMirror(str(log_dir), tempfile.mkdtemp(prefix="tbmem-remote-"),
                                            every_s=float(os.environ.get("TBMEM_REMOTE_EVERY_S", "10")))
                log_dir = self._mirror.local
            # resolved once: after an os.chdir a relative logdir would name another folder
            log_dir = os.path.abspath(os.fspath(log_dir) if log_dir is not None else default_run_dir())
            _check_writable(log_dir)
            self._adopted = None
            SummaryWriter.__init__(self, log_dir)
        else:
            self._adopt(writer)
        self._table = self._ranks.table_sink() if self._ranks is not None else None  # compact layout
        self._log_dir = os.path.abspath(str(self._log_dir))
        self._last_step = None
        cfg = self.config
        # A full or read-only disk must not end the run: errors in TensorBoard's writer thread are
        # caught where they surface, counted here and reported once (tbmem._internal._safe_io). The compiled
        # CRC serves these event files only (tbmem._internal._fastcrc): other SummaryWriters keep TensorBoard's.
        self._faults = FaultLedger(self._log_dir)
        # the first sink: the run's event file (a rank's private run in the compact layout is read by
        # nobody before close: its events reach the file in batches)
        staged = self._ranks is not None and self._ranks.staged
        self._tensorboard = TensorBoardSink.for_run(
            self, faults=self._faults, fast_crc=cfg.fast_crc, direct=cfg.flush_each_record,
            layout=cfg.custom_layout and cfg.enabled, held_bytes=_HELD_BYTES if staged else 0)
        self._sinks = SinkSet([], tensorboard=self._tensorboard)
        self._emit = self._emitter()
        self._probe_guard = ProbeGuard()
        self._models = []
        self._optimizers = []
        self._probes = []
        self._record = ProbesComponent(self._probes, self._probe_guard, self._emit)
        self._census_every = 0
        self._snapshots = self._alerts = self._spikes = self._profile = None
        # what the step path loops over (tbmem._internal._writer_components): only the configured components
        self._components = Components()
        self._active = cfg.enabled
        if self._active:
            try:
                self._setup()
            except BaseException:  # a missing extra, a bad sink: the user gets the error, not a half-built writer
                self._abandon_setup()
                raise
        elif self._ranks is not None:  # monitoring off: every rank still joins the record's collective
            self._components.add(RanksComponent(self._ranks))
        # Flush at interpreter exit (an unhandled exception ends the run without close()) and finish
        # on SIGTERM, in this process only: a forked child inherits the writer closed (tbmem._internal._process)
        self._at_exit = _process.adopt(self)

    def _emitter(self) -> Emitter:
        """The one output the components get (they never hold the writer): the sinks, TensorBoard first."""
        return Emitter(log_dir=lambda: self._log_dir, faults=self._faults, text=self._write_text,
                       readings=self._write_readings, record=self._write_record, scalars=self.write_scalars,
                       artifact=self.log_artifact, flush=self.flush,
                       models=lambda: self.watched_models, optimizers=lambda: self.watched_optimizers)

    def _setup(self) -> None:
        """Build what the configuration asks for, and put the components in the step loop in the order
        their hooks run (tbmem._internal._writer_components)."""
        cfg = self.config
        emit = self._emit
        self._open_probes()
        census = self._census()
        snapshots = self._build_snapshots()
        self._setup_parts = (census, snapshots)  # what _abandon_setup undoes if the rest fails
        ranks = self._ranks
        if ranks is not None:
            ranks.attach(write=emit.write_scalars, snapshots=lambda: snapshots, flush=emit.flush)
        snapshot_now = snapshots.snapshot_now if snapshots is not None else None
        if cfg.alerts is not None:
            from tbmem._internal.alerts import AlertMonitor

            self._alerts = AlertMonitor(cfg.alerts, emit=emit,
                                        snapshot=_now(snapshot_now, "alert") if cfg.alerts.snapshot else None)
        if cfg.sinks:  # a missing extra raises (a configuration error); a sink that fails is switched off
            # the run's name in the trackers: the run folder's, the job folder's for rank folders
            folder = os.path.dirname(self.log_dir) if ranks is not None else self.log_dir
            opened = SinkSet.open(cfg.sinks, run_name=os.path.basename(folder))
            self._sinks.sinks = opened.sinks if opened is not None else []
        self._record_settings()
        if cfg.spikes is not None:  # sees what the writer writes and what add_scalar writes (tbmem._internal.spikes)
            from tbmem._internal.spikes import SpikeMonitor

            spikes = cfg.spikes  # with the run's loss tags (config.py); TBMEM_LOSS_TAGS's added here
            if extra := env_loss_tags():
                spikes = dataclasses.replace(spikes, tags=tuple(dict.fromkeys((*spikes.tags, *extra))))
            self._spikes = SpikeMonitor(spikes, emit=emit,
                                        snapshot=_now(snapshot_now, "spike") if cfg.spikes.snapshot else None)
        if cfg.profile is not None and cfg.profile.enabled:  # torch.profiler windows (tbmem._internal.profile)
            from tbmem._internal.profile.window import ProfileWindows

            fired = self._alerts.fired if self._alerts is not None else []
            self._profile = ProfileWindows(cfg.profile, log_dir=self.log_dir, device_index=cfg.device,
                                           rank=ranks.info.rank if ranks is not None else 0,
                                           alerts=lambda: fired,
                                           on_written=functools.partial(emit.log_artifact, kind="trace"))
        profile = ProfileComponent(self._profile) if self._profile is not None else None
        order: list[StepComponent | None] = [
            profile, self._record, RanksComponent(ranks) if ranks is not None else None,
            SnapshotsComponent(snapshots) if snapshots is not None else None,
            AlertsComponent(self._alerts) if self._alerts is not None else None, census,
            SpikesComponent(self._spikes) if self._spikes is not None else None,
            profile.closing if profile is not None else None]
        for component in order:
            if component is not None:
                self._components.add(component)

    def _abandon_setup(self) -> None:
        """``_setup`` raised: undo what it started (the census's gc hook, a recording, the probes, the event
        file), so a writer that was never returned leaves nothing running in the process."""
        census, snapshots = getattr(self, "_setup_parts", (None, None))
        undo: list[Callable[[], object]] = [probe.stop for probe in self._probes]
        if census is not None:
            undo.append(census.stop_capture)
        if snapshots is not None:
            undo.append(snapshots.close)
        undo.append(lambda: SummaryWriter.close(self))
        for step in undo:
            try:
                step()
            except Exception:  # noqa: BLE001 - the setup's own error is the one the user must see
                pass
        self.closed = True
        _release_recorders()

    def _open_probes(self) -> None:
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

    def _census(self) -> CensusComponent | None:
        cfg = self.config
        if cfg.census_every <= 0:
            return None
        from tbmem._internal.census import heap

        # Lets censuses after the first scan only what is new (see tbmem._internal.census.heap); undone on
        # close, when the census is switched off, or when the writer is collected unclosed.
        heap.start_capture()
        self._census_every = cfg.census_every
        return CensusComponent(top_k=cfg.top_k, device=cfg.device, large=LargeThreshold(cfg.large_tensor_mb),
                               emit=self._emit, stop_capture=weakref.finalize(self, heap.stop_capture),
                               module_depth=cfg.module_depth)

    def _record_settings(self) -> None:
        """The run's loss tags and module depth, for the readers that see only the logdir (the Memory tab,
        ``tbmem report``: tbmem._internal.logdir.settings); nothing for the defaults (read as the defaults)."""
        from tbmem._internal.census.names import module_depth
        from tbmem._internal.logdir.settings import append_settings

        losses = tuple(dict.fromkeys((*self.config.loss_tags, *env_loss_tags())))
        depth = module_depth(self.config.module_depth)  # TBMEM_MODULE_DEPTH's, where it is set
        if losses or depth != 1:
            try:
                append_settings(self.log_dir, loss_tags=losses, module_depth=depth)
            except OSError as exc:  # a full or read-only disk: counted like the other writes
                self._faults.failed(self.log_dir, exc)

    def _build_snapshots(self) -> SnapshotManager | None:
        """The snapshot manager ``snapshot=`` asks for; else one without a schedule where an alert's or a
        spike's ``snapshot`` asks for one (only these and an out-of-memory error use it)."""
        cfg = self.config
        if cfg.snapshot is not None and getattr(cfg.snapshot, "enabled", True):
            base = cfg.snapshot
        elif (cfg.alerts is not None and cfg.alerts.snapshot) or (cfg.spikes is not None and cfg.spikes.snapshot):
            from tbmem._internal.snapshot import SnapshotConfig

            base = SnapshotConfig(recorder="off")
        else:
            return None
        from tbmem._internal.snapshot import SnapshotManager

        snapshot = self._ranks.snapshot_config(base) if self._ranks is not None else base
        self._snapshots = SnapshotManager(snapshot, log_dir=self.log_dir, writer=self._emit)
        return self._snapshots

    def _adopt(self, writer: SummaryWriter) -> None:
        """Take over ``writer``'s log directory and event files (``writer=``): the same file objects,
        so what either writes lands in one file, in order."""
        if not isinstance(writer, SummaryWriter):
            raise TypeError(f"MemoryWriter(writer=...) takes a torch.utils.tensorboard.SummaryWriter, "
                            f"got {type(writer).__name__}")
        adopt_event_files(writer)  # reopened if it was closed
        self.log_dir = str(writer.get_logdir())
        for name in _ADOPTED:
            if hasattr(writer, name):
                setattr(self, name, getattr(writer, name))
        self.file_writer, self.all_writers = writer.file_writer, writer.all_writers
        self._adopted = writer

    # --- SummaryWriter: its write methods guarded (below the class), add_scalar seen by spikes ---------
    def add_scalar(self, tag: str, scalar_value: Any, global_step: int | None = None, walltime: float | None = None,
                   new_style: bool = False, double_precision: bool = False) -> None:
        """``SummaryWriter.add_scalar``, guarded like every ``add_*`` method; the spike detector
        (``spikes=``) sees the value."""
        if self.closed:
            self._after_close("add_scalar")
            return
        try:
            SummaryWriter.add_scalar(self, tag, scalar_value, global_step, walltime, new_style, double_precision)
        except OSError as exc:  # only where tbmem._internal._safe_io could not guard the writer thread
            self._faults.failed(self._log_dir, exc, events=1)
        if self._table is not None and isinstance(global_step, int) and (
                kept := table_scalars({tag: scalar_value}, self.config.loss_tags)):
            self._table(global_step, kept)  # compact layout: a rank's loss and step time are in its table
        if global_step is None:
            return
        for component in self._components.on_scalars:  # the spike detector, an open profile window
            try:
                component.on_scalars({tag: scalar_value}, int(global_step))
            except Exception as exc:  # noqa: BLE001 - monitoring must never break training
                self._component_failed(component, exc)

    @property
    def profile(self) -> ProfileWindows | None:
        """The run's profile windows (:class:`tbmem._internal.profile.window.ProfileWindows`; ``.window`` is the
        open one), or None without ``profile=``."""
        return self._profile

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

    # --- lifecycle ----------------------------------------------------------------------
    def close(self) -> None:
        """Finish snapshots, stop the probes, flush and close the event files.

        Never raises an I/O error; what could not be written is reported in one line.
        """
        if self.closed:
            _release_recorders()  # a second close() on the recording's own thread removes its mode
            return
        try:
            # in the order of adding: the profile windows (a window still open: its trace, cut short),
            # the probes, the ranks, the snapshots, the census (its heap capture undone)
            for component, exc in self._components.close():
                self._component_failed(component, exc)
            self._flush_quietly()
            self._sinks.close()  # the trackers' runs; TensorBoard's files are closed below
            try:
                if self._adopted is not None:  # the files are its too: closed once, for both
                    self._adopted.close()
                    self.file_writer = self.all_writers = None
                else:
                    SummaryWriter.close(self)
            except OSError as exc:
                self._faults.failed(self.log_dir, exc)
            if self._ranks is not None:  # compact layout: the rank's run joins the job if it matters
                moved = self._ranks.finish(alerted=bool(self._alerts is not None and self._alerts.fired))
                self._log_dir = moved or self._log_dir
            if self._mirror is not None:  # the last round of uploads, after every file is closed
                self._mirror.close()
        finally:
            self.closed = True
            _process.release(self, self._at_exit)
            _release_recorders()
        self._faults.report_close()

    def _finish(self, reason: str) -> None:
        """On SIGTERM: flush, write a final record at the last step seen, close (tbmem._internal._signals)."""
        _signals.finish_writer(self, reason)

    def __enter__(self) -> "MemoryWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _guarded(name: str, method: Any) -> Any:
    """``SummaryWriter.<name>`` as a MemoryWriter's own method: ignored after close() (one line),
    an I/O error counted in :attr:`MemoryWriter.faults` instead of raised."""
    @functools.wraps(method)
    def call(self: MemoryWriter, *args: Any, **kwargs: Any) -> Any:
        if self.closed:
            self._after_close(name)
            return None
        try:
            return method(self, *args, **kwargs)
        except OSError as exc:  # only where tbmem._internal._safe_io could not guard the writer thread
            self._faults.failed(self._log_dir, exc, events=1)
            return None
    return call


for _name, _method in list(vars(SummaryWriter).items()):
    if _name.startswith(_WRITE_PREFIX) and callable(_method) and _name not in vars(MemoryWriter):
        setattr(MemoryWriter, _name, _guarded(_name, _method))


def _now(snapshot_now: Callable[[int, str], list[str]] | None, kind: str) -> Callable[[int], list[str]]:
    """``step -> paths``: a snapshot taken at once (an alert's, a spike's)."""
    if snapshot_now is None:
        return lambda step: []
    return lambda step: snapshot_now(step, kind)


def _release_recorders() -> None:
    """Remove snapshot recording modes stopped from another thread that this thread still holds."""
    recorder = sys.modules.get("tbmem._internal.snapshot.recorder")
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
