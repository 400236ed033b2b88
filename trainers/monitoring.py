"""The thin adapter between the trainers and tbmem, built from the config alone.

One :class:`TrainerMonitoring` owns the run's :class:`tbmem.MemoryWriter` (the
TensorBoard writer the trainers log their losses through, monitoring on or off)
and, when ``trainer_params.enable_memory_monitoring`` is true, tbmem's console
monitors. The trainers call a handful of hooks; every hook is a cheap no-op
when monitoring is off, and no hook raises: a failing monitor is reported
once on the ``tbmem`` logger and switched off (inside a PhiFlow loss function
an exception would hang SciPy's L-BFGS-B worker).

Example:
    >>> import tempfile
    >>> from tbmem import MemoryWriterConfig
    >>> from trainers.monitoring import TrainerMonitoring
    >>> mon = TrainerMonitoring.create(tempfile.mkdtemp(), enabled=False, verbose_batches=5,
    ...                                tbmem_config=MemoryWriterConfig())
    >>> mon.on_epoch_start(); mon.on_batch_start(0); mon.on_batch_end(0, 0.5); mon.on_epoch_end()
    >>> mon.close()
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from typing import Any, Callable, Iterator, Mapping, TextIO, cast

import torch

from tbmem import TAGS, MemoryWriterConfig, mark_snapshot, report_once, snapshot_recording

__all__ = ["console_above_progress_bar", "evaluation_line", "TrainerMonitoring", "CENSUS_POINTS"]

_NEVER = 2**62  # a step no run reaches: the gradient norm is off
_GRAD_NORM = TAGS["grad_norm"].tag

#: Where a SyntheticTrainer step takes its memory record and census, and how its census table says it.
CENSUS_POINTS = {
    "after_backward": "after backward and the optimizer step, before zero_grad: parameters, gradients and "
                      "optimizer state are alive; backward has freed the activations it saved",
    "before_backward": "before backward: the activations saved for backward are alive; gradients are None "
                       "(zero_grad(set_to_none=True))",
}


class TrainerMonitoring:
    """TensorBoard writer plus optional console monitors, driven by a few hook calls.

    Args:
        writer: The run's MemoryWriter.
        enabled: Whether memory monitoring is on.
        verbose_batches: Batches (or loss evaluations) printed in detail.
        device: CUDA device index the monitors read, or None on CPU.
        census_at: Where in a SyntheticTrainer step the memory record and its census are taken
            (a key of :data:`CENSUS_POINTS`; ``trainer_params.census_at``).
    """

    def __init__(self, writer: Any, *, enabled: bool, verbose_batches: int, device: int | None,
                 census_at: str = "after_backward") -> None:
        if census_at not in CENSUS_POINTS:
            raise ValueError(f"census_at must be one of {sorted(CENSUS_POINTS)}, got {census_at!r}")
        self.writer = writer
        self.enabled = enabled
        self.census_at = census_at
        self.verbose_batches = verbose_batches
        self.device = device
        self.epoch_perf: Any = None
        self.epoch_memory: Any = None
        self.perf: Any = None
        self.memory_monitor: Any = None
        self._evaluations_on = enabled
        # Where the per-step hooks write the record, decided once: they run at every step.
        self._record_before_backward = enabled and census_at == "before_backward"
        self._record_after_backward = enabled and census_at == "after_backward"
        # Snapshot markers are made only while a recorder records (checked when a step starts and
        # after each record, where a recording window opens or closes): a mark() call costs a few
        # microseconds even when it does nothing. The first step marks anyway, which tells the
        # snapshot manager that this trainer marks its own steps (see tbmem.mark_snapshot).
        self._marking = False
        self._first_step = True
        # Whether log_memory has anything to do at the step in progress (what begin_step said): the
        # steps where it has not skip the call.
        self._due = True
        #: Whether the step in progress needs before_backward and before_optimizer (a record before
        #: backward, or snapshot markers): the trainer skips the two calls otherwise.
        self.mid_step_hooks = self._record_before_backward
        #: The next step whose gradient norm is logged (``Train/grad_norm``, every ``tbmem.every`` steps while
        #: monitoring is on): the trainer compares its step with it, one comparison per step, no call.
        self.grad_norm_next = 0 if enabled else _NEVER
        if enabled:
            self._build_monitors()

    @classmethod
    def create(cls, log_dir: str | os.PathLike[str], *, enabled: bool, verbose_batches: int,
               tbmem_config: MemoryWriterConfig, device: torch.device | None = None,
               census_at: str = "after_backward") -> "TrainerMonitoring":
        """Open the MemoryWriter at ``log_dir`` with ``tbmem_config`` (memory logging off unless ``enabled``)."""
        from tbmem import MemoryWriter

        index = None
        if device is not None and device.type == "cuda":
            index = device.index if device.index is not None else 0
        changes: dict[str, Any] = {"enabled": tbmem_config.enabled and enabled}
        if index is not None and tbmem_config.device is None:
            changes["device"] = index
        config = dataclasses.replace(tbmem_config, **changes)
        writer = MemoryWriter(log_dir, config=config)
        return cls(writer, enabled=enabled, verbose_batches=verbose_batches, device=index, census_at=census_at)

    def _build_monitors(self) -> None:
        from tbmem.console import EpochMemoryMonitor, EpochPerformanceMonitor, MemoryMonitor, PerformanceMonitor

        n, w = self.verbose_batches, self.writer
        # Only the performance monitor gets the writer: its per-batch scalars already include the
        # memory monitor's (RSS, GPU, loss), and two writers would log each tag twice per step.
        # It logs at the writer's interval: one event per batch (~0.5 ms) would cost ~1% of a step.
        every = getattr(getattr(w, "config", None), "every", 1)
        self.epoch_perf = self._build("EpochPerformanceMonitor", lambda: EpochPerformanceMonitor(
            enabled=True, verbose_batches=n, device=self.device, writer=w, log_every=every))
        self.epoch_memory = self._build("EpochMemoryMonitor", lambda: EpochMemoryMonitor(
            enabled=True, verbose_batches=n))
        self.perf = self._build("PerformanceMonitor", lambda: PerformanceMonitor(writer=w))
        self.memory_monitor = MemoryMonitor

    def _build(self, name: str, make: Callable[[], Any]) -> Any:
        try:
            return make()
        except Exception as exc:  # noqa: BLE001 - a broken monitor must not stop training
            report_once(f"trainers:build:{name}", f"trainers: could not create {name}; it is off", exc=exc)
            return None

    def _call(self, attr: str, method: str, *args: Any) -> Any:
        monitor = getattr(self, attr)
        if monitor is None:
            return None
        try:
            return getattr(monitor, method)(*args)
        except Exception as exc:  # noqa: BLE001 - monitoring never raises into training
            self._failed(attr, monitor, method, exc)
            return None

    def _failed(self, attr: str, monitor: Any, method: str, exc: Exception) -> None:
        report_once(f"trainers:{attr}", f"trainers: {type(monitor).__name__}.{method} failed; "
                    "it is switched off", exc=exc)
        setattr(self, attr, None)

    # --- SyntheticTrainer hooks -------------------------------------------------------------
    def on_epoch_start(self) -> None:
        """Start an epoch's timing and peak window."""
        self._call("epoch_perf", "on_epoch_start")

    # The per-step hooks below call their monitor directly (not through _call): they run at every
    # step, and each indirection costs microseconds inside a training step, where the caches are
    # cold from the step's own work (a call costs ~2 us there, ten times what it costs in a loop).
    def on_batch_start(self, batch_idx: int, step: int | None = None) -> None:
        """Start timing a batch; with ``step``, begin that training step: the writer names it in an
        out-of-memory snapshot, and while a recorder records it is marked (with its forward phase)."""
        monitor = self.epoch_perf
        if monitor is not None:
            try:
                monitor.on_batch_start(batch_idx)
            except Exception as exc:  # noqa: BLE001 - monitoring never raises into training
                self._failed("epoch_perf", monitor, "on_batch_start", exc)
        if step is None or not self.enabled:
            self._due = True
            return
        self._due = self.writer.begin_step(step)
        marking = self._marking = snapshot_recording()
        self.mid_step_hooks = marking or self._record_before_backward
        if marking or self._first_step:
            self._first_step = False
            mark_snapshot(f"step {step}", kind="step")
            mark_snapshot("forward", kind="phase")

    def before_backward(self, step: int, loss: torch.Tensor) -> None:
        """With ``census_at="before_backward"``, log the due record here: the census walks ``loss``'s
        graph while the activations saved for backward are alive (gradients are None). Needed only
        while :attr:`mid_step_hooks` is true."""
        if self._record_before_backward and self._due:
            self._log(step, loss, "before_backward")
            self._marking = snapshot_recording()
        if self._marking:
            mark_snapshot("backward", kind="phase")

    def before_optimizer(self, step: int) -> None:
        """The optimizer step begins (a phase boundary in memory snapshots). Needed only while
        :attr:`mid_step_hooks` is true."""
        if self._marking:
            mark_snapshot("optimizer", kind="phase")

    def before_zero_grad(self, step: int, loss: torch.Tensor) -> None:
        """With ``census_at="after_backward"`` (the default), log the due record here: after backward
        and the optimizer step, before ``zero_grad``, the census sees the gradients and the optimizer
        state next to the parameters (backward has freed the saved activations; ``loss`` is a root
        for any graph still alive)."""
        if self._record_after_backward and self._due:
            self._log(step, loss, "after_backward")

    def _log(self, step: int, loss: torch.Tensor, where: str) -> None:
        """``log_memory`` for ``step`` (the steps where ``begin_step`` said nothing is due skip it)."""
        self.writer.log_memory(step, roots=(loss,), where=CENSUS_POINTS[where])

    def log_grad_norm(self, step: int, model: torch.nn.Module, *, amp_scaled: bool = False) -> None:
        """Write the norm of ``model``'s gradients (after backward and the optimizer step, before
        ``zero_grad``) as ``Train/grad_norm`` at ``step``; the next one is due ``tbmem.every`` steps on.

        With a GradScaler (``amp_scaled``) a non-finite norm is the overflow the scaler skipped the step
        for, and is not written. Never raises: a failure is reported once and the norm is off.
        """
        every = getattr(getattr(self.writer, "config", None), "every", 1)
        self.grad_norm_next = (step // every + 1) * every
        try:
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            if not grads:
                return
            norm = float(torch.nn.utils.get_total_norm(grads))
            if amp_scaled and not math.isfinite(norm):
                return
            self.writer.write_scalars({_GRAD_NORM: norm}, step)
        except Exception as exc:  # noqa: BLE001 - monitoring never raises into training
            report_once("trainers:grad-norm", "trainers: logging the gradient norm failed; it is off", exc=exc)
            self.grad_norm_next = _NEVER

    def on_batch_end(self, batch_idx: int, loss: float) -> None:
        """Finish a batch: its time, memory and loss (printed for the first batches)."""
        monitor = self.epoch_perf
        if monitor is not None:
            try:
                monitor.on_batch_end(batch_idx, loss)
            except Exception as exc:  # noqa: BLE001 - monitoring never raises into training
                self._failed("epoch_perf", monitor, "on_batch_end", exc)

    def on_epoch_end(self) -> None:
        """Print the epoch's totals and peak memory."""
        self._call("epoch_perf", "on_epoch_end")

    def on_step_error(self, step: int, exc: BaseException) -> None:
        """``exc`` leaves training step ``step``: on out-of-memory save the snapshot and record, else
        flush; the trainer then re-raises ``exc`` (a ``try``/``except`` around the step costs nothing
        until something is raised, where a ``with`` block would be two calls per step)."""
        self.writer.step_failed(step, exc)

    # --- PhysicalTrainer hooks --------------------------------------------------------------
    @contextlib.contextmanager
    def track(self, name: str) -> Iterator[None]:
        """Time and measure a phase (a row of the PERFORMANCE SUMMARY table)."""
        if self.perf is None:
            yield
            return
        try:
            cm = self.perf.track(name)
            cm.__enter__()
        except Exception as exc:  # noqa: BLE001
            report_once("trainers:perf", "trainers: PerformanceMonitor.track failed; it is off", exc=exc)
            self.perf = None
            yield
            return
        try:
            yield
        finally:
            try:
                cm.__exit__(None, None, None)
            except Exception as exc:  # noqa: BLE001
                report_once("trainers:perf", "trainers: PerformanceMonitor.track failed; it is off", exc=exc)
                self.perf = None

    def print_memory(self, prefix: str) -> None:
        """Print one memory line (``MemoryMonitor.print_memory_usage``)."""
        self._call("memory_monitor", "print_memory_usage", prefix)

    def optimization_start(self) -> None:
        """Open the optimisation's peak-memory window."""
        self._call("epoch_memory", "on_epoch_start")

    def optimization_end(self) -> None:
        """Print the optimisation's peak memory in design document 000's format."""
        monitor = self.epoch_memory
        if monitor is None:
            return
        from tbmem.console import emit, read_memory, silence_output

        try:
            with silence_output():  # closes the peak window; its "Epoch end" line is not this report
                monitor.on_epoch_end()
            if monitor.last_peak_mb is not None:
                kind = "GPU" if read_memory().has_gpu else "CPU"
                emit(f"Peak {kind} memory during optimization: {monitor.last_peak_mb:.1f} MB")
        except Exception as exc:  # noqa: BLE001 - a monitoring failure must not end the run
            report_once("trainers:optimization-peak", "trainers: the optimisation's peak report failed", exc=exc)

    def on_evaluation(self, index: int, loss: float, params: Mapping[str, float]) -> None:
        """Record one loss evaluation; never raises (it runs inside a PhiFlow loss function).

        Every evaluation goes to TensorBoard at step ``index`` (loss, parameters and, when
        monitoring is on, the due memory record). With monitoring on, the console prints the first
        ``verbose_batches`` evaluations as design document 000 does,
        ``Loss evaluation 0: CPU: 853.2 MB | GPU: 0.8 MB`` (:func:`evaluation_line`), beside the
        iterations of :meth:`on_iteration`.
        """
        try:
            from tbmem import tag_for

            values = {tag_for("eval_loss"): loss}
            values.update({tag_for("eval_param", name): v for name, v in params.items()})
            self.writer.write_scalars(values, index)
        except Exception as exc:  # noqa: BLE001 - a raise here would hang SciPy
            report_once("trainers:evaluation-scalars", "trainers: writing the loss evaluation failed",
                        exc=exc)
        mark_snapshot(f"after evaluation {index}", kind="step")
        if not self._evaluations_on:
            return
        try:
            if index < self.verbose_batches:
                from tbmem.console import emit, read_memory

                emit(evaluation_line(index, read_memory(self.device)))
            self.writer.log_memory(index)
        except Exception as exc:  # noqa: BLE001 - a raise here would hang SciPy
            report_once("trainers:evaluation", "trainers: monitoring a loss evaluation failed; "
                        "it is switched off", exc=exc)
            self._evaluations_on = False

    def on_iteration(self, it: Any) -> None:
        """Record one L-BFGS-B iteration (a :class:`trainers.lbfgs.Iteration`); never raises (it runs on
        SciPy's worker thread while PhiML's main thread waits).

        TensorBoard gets, at step ``it.number``: ``Loss/iteration``, ``LBFGS/grad_norm``,
        ``LBFGS/evaluations``, ``LBFGS/iteration_time_ms`` and, with monitoring on, the process's RSS
        (and allocated VRAM when CUDA is initialised) read now; the console prints the first
        ``verbose_batches`` iterations with that memory.
        """
        try:
            from tbmem import TAGS

            values = {TAGS["iteration_loss"].tag: it.loss, TAGS["iteration_evaluations"].tag: it.evaluations,
                      TAGS["iteration_time"].tag: it.seconds / TAGS["iteration_time"].scale}
            if it.grad_norm == it.grad_norm:  # NaN: no evaluation was at the iterate
                values[TAGS["iteration_grad_norm"].tag] = it.grad_norm
            reading = None
            if self._evaluations_on:
                from tbmem.console import read_memory as read

                reading = read(self.device)
                if reading.cpu is not None:
                    values[TAGS["iteration_rss"].tag] = reading.cpu / TAGS["iteration_rss"].scale
                if reading.gpu_allocated is not None:
                    values[TAGS["iteration_vram"].tag] = reading.gpu_allocated / TAGS["iteration_vram"].scale
            self.writer.write_scalars(values, it.number)
            if self._evaluations_on and it.number <= self.verbose_batches:
                self.print_iteration(it.number, it.loss, evaluations=it.evaluations, reading=reading)
        except Exception as exc:  # noqa: BLE001 - a raise here would hang SciPy
            report_once("trainers:iteration", "trainers: recording an L-BFGS-B iteration failed", exc=exc)

    def print_iteration(self, number: int, loss: float, *, evaluations: int | None = None, reading: Any = None,
                        note: str = "") -> None:
        """One console line per L-BFGS-B iteration, as design document 000 prints them, counted as SciPy
        counts them (from 1, the step of ``Loss/iteration``):
        ``  Iteration 3: loss=3.23807e-08 (5 evaluations); memory: CPU: 309.8 MB | ...``."""
        line = f"  Iteration {number}: loss={loss:.6g}"
        if evaluations is not None:
            line += f" ({evaluations} evaluation{'s' if evaluations != 1 else ''})"
        line += note
        if reading is not None:
            from tbmem.console import emit, usage_line

            emit(usage_line(line + "; memory", reading))
        else:
            print(line, flush=True)

    def iterations_printed(self) -> int:
        """How many iterations :meth:`on_iteration` prints (the first ``verbose_batches``, while on)."""
        return self.verbose_batches if self._evaluations_on else 0

    # --- end of run -------------------------------------------------------------------------
    def print_summary(self) -> None:
        """Print the PERFORMANCE SUMMARY table (physical) or batch timing statistics."""
        self._call("perf", "print_summary")

    def statistics(self) -> dict[str, Any] | None:
        """The EpochPerformanceMonitor's statistics, if it ran."""
        return self._call("epoch_perf", "get_statistics")

    def close(self) -> None:
        """Flush and close the writer."""
        self.writer.close()


class _TqdmStream:
    """A text stream that prints above any open tqdm bar instead of through it."""

    def write(self, text: str) -> int:
        from tqdm import tqdm

        tqdm.write(text.rstrip("\n"))
        return len(text)

    def flush(self) -> None:
        """Nothing to flush: tqdm.write writes through."""


def evaluation_line(index: int, reading: Any) -> str:
    """Design document 000's line for one loss evaluation: the process's RSS and the allocated VRAM
    (``n/a`` where CUDA is not initialised: never a zero that was not read).

    Example:
        >>> from tbmem.console import Reading
        >>> evaluation_line(0, Reading(cpu=853.2 * 2**20, gpu_allocated=0.8 * 2**20))
        'Loss evaluation 0: CPU: 853.2 MB | GPU: 0.8 MB'
    """
    from tbmem.console import format_mb

    return f"Loss evaluation {index}: CPU: {format_mb(reading.cpu)} | GPU: {format_mb(reading.gpu_allocated)}"


@contextlib.contextmanager
def console_above_progress_bar(enabled: bool = True) -> Iterator[None]:
    """Route tbmem's console monitor lines through ``tqdm.write`` while a progress bar is shown."""
    if not enabled:
        yield
        return
    from tbmem.console import redirect_output

    with redirect_output(cast(TextIO, _TqdmStream())):  # a text stream in all that monitors call
        yield
