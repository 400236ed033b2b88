"""SnapshotManager: decides when to record and dump, writes the artifacts, reports them.

:class:`tbmem.MemoryWriter` calls ``on_step(step)`` at the end of every step
(from ``log_memory``), ``on_oom(step, exc)`` when an out-of-memory error
reaches ``monitored_step``, and ``close()``. Nothing here raises into
training: a failure is logged once and switches snapshots off. A snapshot that
cannot be written (full or read-only disk) is dropped and counted in the writer's
:class:`tbmem._internal._safe_io.FaultLedger` (one line per cause, a count at close), and
the next due snapshot tries again.

Recording follows the thread that runs the steps: ``on_step`` from another thread
than the recording's stops it there (see :func:`tbmem._internal.snapshot.recorder.release_detached`)
and records on the calling thread from then on.

Example:
    >>> import tempfile, torch
    >>> from tbmem._internal.snapshot import SnapshotConfig, SnapshotManager
    >>> logdir = tempfile.mkdtemp()
    >>> mgr = SnapshotManager(SnapshotConfig(steps=(1,), html=False), log_dir=logdir)
    >>> for step in range(3):
    ...     x = torch.ones(1024) * step
    ...     mgr.on_step(step)
    >>> mgr.close()
    >>> [p.rsplit("/", 1)[1] for p in mgr.written]
    ['snapshot_rank0_step000000001.json.gz']
"""

from __future__ import annotations

import os
from typing import Any

from tbmem._internal import _torch_private as tp
from tbmem._internal._log import logger, report_once
from tbmem._internal._retry import Backoff
from tbmem._internal._safe_io import FaultLedger, describe
from tbmem._internal.snapshot import markers
from tbmem._internal.snapshot.config import SnapshotConfig
from tbmem._internal.snapshot.cuda_capture import CudaRecorder, XpuRecorder
from tbmem._internal.snapshot.recorder import DispatchRecorder, release_detached
from tbmem._internal.snapshot.schema import Snapshot, encode_json_gz
from tbmem._internal.snapshot.store import SnapshotStore
from tbmem._internal.tags import TAGS

__all__ = ["SnapshotManager", "FILES_TAG"]

FILES_TAG = TAGS["snapshot_files_text"].tag


def _default_rank() -> int:
    for var in ("RANK", "SLURM_PROCID"):
        value = os.environ.get(var, "")
        if value.isdigit():
            return int(value)
    return 0


class SnapshotManager:
    """Records memory history on a schedule and writes snapshot artifacts.

    Args:
        config: The :class:`SnapshotConfig`.
        log_dir: The run's logdir (files go to ``<log_dir>/plugins/tbmem``).
        writer: What receives the scalars, the text summary and the files, and names the watched
            models/optimizers: a :class:`tbmem.MemoryWriter`'s :class:`tbmem._internal._emit.Emitter`;
            None writes files only.
    """

    def __init__(self, config: SnapshotConfig, *, log_dir: str, writer: Any = None) -> None:
        self.config = config
        self.rank = config.rank if config.rank is not None else _default_rank()
        self.store = SnapshotStore(log_dir, rank=self.rank, max_snapshots=config.max_snapshots,
                                   max_disk_mb=config.max_disk_mb)
        self.writer = writer
        self.written: list[str] = []
        ledger = getattr(writer, "faults", None)
        self.faults: FaultLedger = ledger if isinstance(ledger, FaultLedger) else FaultLedger(log_dir)
        self.last_error: str | None = None  # why the latest snapshot (or part of it) was not written
        self._disk_retry = Backoff(base_s=1.0, cap_s=300.0)
        self._oom_census: dict[str, Any] | None = None  # the census taken at an out-of-memory error
        self._recorder: DispatchRecorder | CudaRecorder | None = None
        self._window_end: int | None = None
        self._window_start = 0
        self._last_step = -1
        self._scheduled = config.every > 0 or bool(config.steps)
        self._disabled = not config.enabled or config.recorder == "off"
        self._off = not config.enabled  # "off" still allows the OOM snapshot
        if not self._disabled and self._scheduled:
            if config.window > 0:
                if config.is_due(0):
                    self._begin(window_end=config.window - 1, window_start=0)
            elif config.start_step == 0:
                self._begin()

    # --- schedule -----------------------------------------------------------------------
    def on_step(self, step: int) -> None:
        """Called at the end of each step; cheap unless a recording starts or a snapshot is due."""
        release_detached()
        if self._disabled:
            return
        try:
            rec = self._recorder
            if isinstance(rec, DispatchRecorder) and not rec.on_own_thread:
                # The steps run on another thread than the recording: it would see none of them.
                self._end()
                self._window_end = None
            self._on_step(step)
        except Exception as exc:  # noqa: BLE001 - monitoring must never break training
            self._fail("snapshot:step", "tbmem: memory snapshots failed and are switched off", exc)

    def _on_step(self, step: int) -> None:
        markers.mark(f"after step {step}", kind="step", auto=True)  # log_memory(step) ends a step
        cfg = self.config
        self._last_step = step
        rec = self._recorder
        if rec is not None and isinstance(rec, DispatchRecorder) and rec.failed is not None:
            raise RuntimeError(f"the allocation recorder failed: {rec.failed!r}")
        if cfg.window > 0:
            if self._window_end is not None and step >= self._window_end:
                self._window_end = None
                self._dump(self._window_start, "snapshot")  # named after the window's first step
                self._end()
            if self._window_end is None and cfg.is_due(step + 1):
                self._begin(window_end=step + cfg.window, window_start=step + 1)
            return
        if rec is None:
            if self._scheduled and step + 1 >= cfg.start_step:
                self._begin()
            return
        if cfg.is_due(step):
            self._dump(step, "snapshot")

    def _begin(self, window_end: int | None = None, window_start: int = 0) -> None:
        cfg = self.config
        use_cuda = cfg.recorder == "cuda" or (cfg.recorder == "auto" and tp.cuda_ready() and tp.has_memory_history())
        if not use_cuda and cfg.recorder == "auto" and not tp.cuda_ready() and tp.xpu_ready():
            if tp.xpu_has_memory_history():  # an Intel XPU: its allocator's own history, as CUDA's
                xpu = XpuRecorder(max_entries=cfg.max_entries, stacks=cfg.stacks)
                if xpu.start():
                    self._recorder, self._window_end, self._window_start = xpu, window_end, window_start
                    return
            report_once("snapshot:xpu", "tbmem: this torch records no XPU memory history "
                        "(torch.xpu.memory._record_memory_history): XPU snapshots hold what the dispatch "
                        "recorder sees (tensors made by operators), not the XPU allocator's segments")
        if use_cuda:
            rec: DispatchRecorder | CudaRecorder = CudaRecorder(max_entries=cfg.max_entries, stacks=cfg.stacks)
            if not rec.start():
                report_once("snapshot:cuda", "tbmem: CUDA memory history is unavailable (CUDA not initialised "
                            "or unsupported); snapshots wait until it is")
                return
        else:
            w = self.writer
            rec = DispatchRecorder(
                max_entries=cfg.max_entries, stacks=cfg.stacks, stack_depth=cfg.stack_depth,
                models=(lambda: w.watched_models) if w is not None and hasattr(w, "watched_models") else tuple,
                optimizers=(lambda: w.watched_optimizers) if w is not None and hasattr(w, "watched_optimizers")
                else tuple,
                backend=cfg.recorder,
            )
            rec.start()
        self._recorder = rec
        self._window_end = window_end
        self._window_start = window_start

    def _end(self) -> None:
        rec, self._recorder = self._recorder, None
        if rec is not None:
            rec.stop()
            if isinstance(rec, DispatchRecorder):
                rec.reset()

    # --- writing ------------------------------------------------------------------------
    def _capture(self, step: int, kind: str, stop: bool = True) -> tuple[Snapshot | None, dict[str, Any] | None]:
        rec = self._recorder
        if isinstance(rec, CudaRecorder) or (rec is None and tp.cuda_ready() and tp.has_memory_history()):
            cuda = rec if isinstance(rec, CudaRecorder) else CudaRecorder()
            raw = cuda.raw_snapshot()
            if raw is None:
                return None, None
            return cuda.snapshot(raw, kind=kind, step=step, rank=self.rank), raw
        if rec is None:  # nothing recorded (e.g. an OOM before the first window): watched tensors only
            w = self.writer
            rec = DispatchRecorder(models=lambda: w.watched_models if w is not None else (),
                                   optimizers=lambda: w.watched_optimizers if w is not None else ())
            rec._register_watched(category_from_role=True)
        if rec.active and kind == "oom" and stop:
            rec.stop()
        return rec.snapshot(kind=kind, step=step, rank=self.rank), None

    def _dump(self, step: int, kind: str, exc: BaseException | None = None, stop: bool = True) -> list[str]:
        self.last_error = None
        if kind != "oom" and not self._disk_retry.ready():
            self.faults.dropped(snapshots=1)  # the disk refused the last one: wait before retrying
            return []
        snap, raw = self._capture(step, kind, stop)
        if snap is None:
            return []
        if exc is not None:
            snap.meta["exception"] = f"{type(exc).__name__}: {exc}"[:4000]
        if kind == "oom" and self._oom_census is not None:
            snap.meta["oom_census"] = self._oom_census
        cfg = self.config
        store = self.store
        files: list[tuple[str, Any]] = [("json.gz", lambda fh: fh.write(encode_json_gz(snap)))]
        if cfg.html:
            from tbmem._internal.snapshot.viewer import render_html

            files.append(("html", lambda fh: fh.write(render_html(snap).encode("utf-8"))))
        if raw is not None and cfg.pickle:
            files.append(("pickle", lambda fh: tp.dump_snapshot_pickle(raw, fh)))
        elif raw is None and cfg.torch_pickle:  # a CPU snapshot in torch's format, for memory_viz
            from tbmem._internal.snapshot.torch_format import dumps_plain, torch_snapshot

            files.append(("pickle", lambda fh: fh.write(dumps_plain(torch_snapshot(snap)))))
        # Each file on its own: a .json.gz written before the disk filled up is kept and reported.
        paths, err = store.write_files(kind, step, files)
        if err is not None:
            missing = [ext for ext, _ in files[len(paths):]]
            self.last_error = f"{', '.join(missing)} not written: {describe(err)}" if paths else describe(err)
            self._disk_retry.failed()
            self.faults.failed(store.folder, err, snapshots=0 if paths else 1)
        else:
            self._disk_retry.succeeded()
        if not paths:
            return []
        try:
            store.prune(keep=(kind, step))
        except OSError as prune_err:
            report_once("snapshot:prune", f"tbmem: could not remove old snapshots in {store.folder}",
                        exc=prune_err)
        self.written.extend(paths)
        self._report(snap, paths, step)
        return paths

    def _report(self, snap: Snapshot, paths: list[str], step: int) -> None:
        w = self.writer
        if w is None:
            return
        size = os.path.getsize(paths[0])
        w.write_readings({"snapshot_events": snap.n_events, "snapshot_size": size}, step)
        _, peak = snap.peak()
        lines = [f"**Memory snapshot** ({snap.kind}, step {step}, rank {snap.rank}, {snap.source} on "
                 f"{snap.device}): {snap.n_events} events, peak {peak / 2**20:.2f} MiB, "
                 f"{snap.dropped} older events dropped.", ""]
        for p in paths:
            note = {"html": "offline viewer, open in a browser", "pickle": "for PyTorch's memory_viz (trusted "
                    "pickle)", "gz": "tbmem JSON: `tbmem snapshot stats FILE`"}[p.rsplit(".", 1)[1]]
            lines.append(f"- `{p}` ({os.path.getsize(p) / 2**10:.1f} KiB, {note})")
        w.add_text(FILES_TAG, "\n".join(lines), step)
        log_artifact = getattr(type(w), "log_artifact", None)  # a MemoryWriter's sinks (tbmem._internal.sinks)
        if log_artifact is not None:
            for p in paths:
                if not p.endswith(".pickle"):  # the offline page and tbmem's JSON; not the trusted pickle
                    log_artifact(w, p, "snapshot")

    # --- failures -----------------------------------------------------------------------
    def on_oom(self, step: int, exc: BaseException, *, stop_recording: bool = True,
               census: dict[str, Any] | None = None) -> list[str]:
        """Write the out-of-memory snapshot (and its HTML); never raises. Returns the paths.

        ``stop_recording=False`` keeps the recorder running: another rank ran out of memory
        and this call may come from tbmem's watcher thread (see tbmem._internal.ranks.oom). ``census``: the
        census taken at the error (:func:`tbmem._internal.oom.census.take_at_oom`), kept in the file's
        ``meta["oom_census"]`` for ``tbmem snapshot stats`` and the page's explanation.
        """
        self._oom_census = census
        if self._off or not self.config.on_oom:
            return []
        if not stop_recording:
            try:
                return self._dump(step, "oom", exc, stop=False)
            except Exception as err:  # noqa: BLE001 - never into training
                report_once("snapshot:oom", "tbmem: could not write the out-of-memory snapshot", exc=err)
                return []
        try:
            paths = self._dump(step, "oom", exc)
            if self.writer is None and paths:  # a MemoryWriter says it in its own one OOM line
                logger.error("tbmem: out-of-memory snapshot written to %s", ", ".join(paths))
            return paths
        except Exception as err:  # noqa: BLE001 - the OOM must reach the user, not this
            self.last_error = describe(err)
            if self.writer is None:
                report_once("snapshot:oom", "tbmem: could not write the out-of-memory snapshot", exc=err)
            return []
        finally:
            try:
                self._end()
            except Exception as err:  # noqa: BLE001
                report_once("snapshot:oom-stop", "tbmem: could not stop the snapshot recorder", exc=err)
            self._window_end = None

    def snapshot_now(self, step: int, kind: str = "alert") -> list[str]:
        """Write a snapshot now, off schedule (an alert's); never raises. Returns the paths."""
        if self._off:
            return []
        try:
            return self._dump(step, kind)
        except Exception as err:  # noqa: BLE001 - monitoring must never break training
            report_once("snapshot:now", "tbmem: could not write the requested snapshot", exc=err)
            return []

    def _fail(self, key: str, message: str, exc: BaseException) -> None:
        report_once(key, message, exc=exc)
        self._disabled = True
        self._off = True
        try:
            self._end()
        except Exception as err:  # noqa: BLE001
            report_once("snapshot:stop", "tbmem: could not stop the snapshot recorder", exc=err)

    def close(self) -> None:
        """Stop recording (a window still open is discarded)."""
        self._disabled = True
        self._off = True
        try:
            self._end()
        finally:
            release_detached()
