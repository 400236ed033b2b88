"""``fit``: measure a training step at a few small batch sizes and forecast its peak at any size.

Example:
    >>> import torch
    >>> from tbmem.forecast import fit
    >>> model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    >>> opt = torch.optim.Adam(model.parameters())
    >>> def step(batch):
    ...     x, y = batch
    ...     opt.zero_grad(set_to_none=True)
    ...     torch.nn.functional.mse_loss(model(x), y).backward()
    ...     opt.step()
    >>> forecast = fit(step, lambda n: (torch.randn(n, 32), torch.randn(n, 1)), batch_sizes=(8, 16, 32),
    ...                model=model, optimizer=opt)
    >>> m = forecast.measure(256)
    >>> abs(m.error) < 0.01, forecast.peak_bytes(256) == m.predicted_bytes
    (True, True)
    >>> n = forecast.max_batch_size(2**20)
    >>> forecast.peak_bytes(n) <= 2**20 < forecast.peak_bytes(n + 1)
    True
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch

from tbmem._internal._log import logger
from tbmem._internal.forecast.budget import Budget, default_budget
from tbmem._internal.forecast.measure import STEP_CATEGORIES, StepMeasurement, device_name
from tbmem._internal.forecast.parts import Parts, fit_parts
from tbmem._internal.forecast.probe import ForecastError, Runner, check_n, incremental_census
from tbmem._internal.forecast.probe import progress as probes
from tbmem._internal.forecast.report import format_table, to_markdown

__all__ = ["fit", "Forecast", "FitQuality", "ForecastError", "DEFAULT_BATCH_SIZES", "DEFAULT_TOLERANCE"]

DEFAULT_BATCH_SIZES = (16, 32, 64)
#: Largest relative error at the probed sizes (and for the held-out largest one) of a good fit.
DEFAULT_TOLERANCE = 0.02


@dataclass(frozen=True)
class FitQuality:
    """How well straight lines in the batch size explain the measured steps.

    Attributes:
        mode: ``"aligned"`` (every allocation and free fitted), ``"phases"`` (each phase's
            peak: the steps ran different operators at different sizes) or ``"peaks"``.
        fit_error: Largest ``|predicted / measured - 1|`` at the probed sizes.
        holdout_error: ``predicted / measured - 1`` for the largest probed size when it is
            left out of the fit (None with two sizes): how well the fit extrapolates.
        nonlinearity: Largest residual of a fitted point, as a fraction of the largest peak.
        tolerance: The bound for :attr:`good`.
    """

    mode: str
    fit_error: float
    holdout_error: float | None
    nonlinearity: float
    tolerance: float

    @property
    def good(self) -> bool:
        """Both errors within the tolerance, and three or more sizes to check it with."""
        return (self.holdout_error is not None and abs(self.holdout_error) <= self.tolerance
                and self.fit_error <= self.tolerance)


class Forecast:
    """Peak memory of a training step as a function of the batch size, fitted on measured steps.

    Built by :func:`fit`. All byte counts are live tensor bytes on :attr:`device` at the
    step's peak: everything alive before the step plus what the step adds (activations
    saved for backward, temporaries, new gradients, optimizer temporaries), less what it
    frees before its peak; on CUDA plus what the caching allocator adds (rounding,
    workspaces), fitted the same way.

    Attributes:
        device: ``cpu`` or ``cuda:<index>``.
        batch_sizes: The probed sizes.
        measurements: One :class:`StepMeasurement` per probed size.
        quality: The :class:`FitQuality`.
        notes: Caveats found while fitting (also logged).
        fit_seconds: Wall time of :func:`fit`, warm-up included.

    Example:
        >>> import torch
        >>> from tbmem.forecast import fit
        >>> lin = torch.nn.Linear(16, 16)
        >>> f = fit(lambda x: lin(x).sum().backward(), lambda n: torch.ones(n, 16), batch_sizes=(4, 8, 16),
        ...         model=lin)
        >>> round(f.bytes_per_sample)  # per sample: the input row (64 B) and the output row (64 B)
        128
    """

    def __init__(self, *, device: str, measurements: list[StepMeasurement], parts: Parts, quality: FitQuality,
                 notes: list[str], fit_seconds: float, runner: "Runner") -> None:
        self.device = device
        self.measurements = measurements
        self.batch_sizes = tuple(m.batch_size for m in measurements)
        self.quality = quality
        self.notes = notes
        self.fit_seconds = fit_seconds
        self._parts = parts
        self._runner = runner

    # --- prediction -------------------------------------------------------------------------
    def peak_bytes(self, n: int) -> int:
        """Forecast live tensor bytes at the peak of a step with batch size ``n``."""
        return int(math.ceil(self._parts.predict(check_n(n)) - 1e-6))

    @property
    def bytes_per_sample(self) -> float:
        """Growth of the peak per sample, for large batches (the steepest fitted line)."""
        return max(b for _, b in self._parts.lines())

    @property
    def fixed_bytes(self) -> float:
        """The intercept of that steepest line: the peak is ``fixed + per_sample * n`` for large ``n``."""
        return max(self._parts.lines(), key=lambda ab: (ab[1], ab[0]))[0]

    def breakdown(self, n: int) -> dict[str, int]:
        """Bytes at the forecast peak for batch size ``n`` by category; the values sum to
        :meth:`peak_bytes` (up to rounding).

        Keys: what was alive before the step (``parameters``, ``gradients``, ``optimizer_state``,
        ``buffers``, ``batch``, ``other``, CUDA ``unattributed``), then what the step holds at its
        peak (``step:activations`` saved in the forward pass, ``step:backward`` temporaries,
        ``step:no_grad`` code such as the optimizer step, ``step:gradients`` and
        ``step:optimizer_state`` created or freed by the step, negative when freed), and on
        CUDA ``allocator_overhead``. Categories that are zero are left out.
        """
        n = check_n(n)
        p = self._parts
        out: dict[str, float] = {}
        for cat, (a, b) in p.before.items():
            out[cat] = a + b * n
        values = p.envelope.a + p.envelope.b * n
        h = int(np.argmax(values))
        for i, cat in enumerate(STEP_CATEGORIES):
            out[f"step:{cat}"] = float(p.step_a[i, h] + p.step_b[i, h] * n)
        out["allocator_overhead"] = p.overhead[0] + p.overhead[1] * n
        return {k: int(round(v)) for k, v in out.items() if round(v) != 0}

    def max_batch_size(self, budget_bytes: int | None = None) -> int | None:
        """The largest ``n`` with ``peak_bytes(n) <= budget_bytes``.

        Args:
            budget_bytes: The budget; None uses :meth:`budget` (free device memory or available
                RAM, minus the margins of :mod:`tbmem._internal.forecast.budget`).

        Returns:
            The batch size; 0 when not even one sample fits; None when the peak does not grow
            with the batch size (any size fits).
        """
        budget = self.budget().bytes if budget_bytes is None else int(budget_bytes)
        lines = self._parts.lines()
        if self.peak_bytes(1) > budget:
            return 0
        if all(b <= 0 for _, b in lines):
            return None
        bound = min((budget - a) / b for a, b in lines if b > 0)
        n = max(int(math.floor(bound)), 0)
        # the float bound is within a step of the integer answer: settle it with peak_bytes itself
        while n > 0 and self.peak_bytes(n) > budget:
            n -= 1
        while self.peak_bytes(n + 1) <= budget:
            n += 1
        return n

    @property
    def resident_bytes(self) -> int:
        """Bytes alive before the last probed step that stay between steps (all but the batch and
        activations): on the CPU, already counted as used in the available RAM."""
        last = self.measurements[-1].before
        return sum(v for k, v in last.items() if k not in ("batch", "activations"))

    def budget(self) -> Budget:
        """The default budget of :attr:`device`, now (see :mod:`tbmem._internal.forecast.budget`)."""
        return default_budget(self.device, resident=self.resident_bytes)

    # --- measuring ----------------------------------------------------------------------------
    def measure(self, n: int) -> StepMeasurement:
        """Run one real step at batch size ``n``, measured the way the fit measured its probes;
        :attr:`StepMeasurement.predicted_bytes` holds this forecast's prediction."""
        with incremental_census():
            m = self._runner.measure(check_n(n))
        m.predicted_bytes = self.peak_bytes(n)
        m.drop_events()
        return m

    # --- output -------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able summary: the fitted lines (the peak is their maximum), errors, notes."""
        q = self.quality
        return {
            "device": self.device, "batch_sizes": list(self.batch_sizes), "mode": q.mode,
            "fit_error": q.fit_error, "holdout_error": q.holdout_error, "good": q.good,
            "fixed_bytes": self.fixed_bytes, "bytes_per_sample": self.bytes_per_sample,
            "resident_bytes": self.resident_bytes,
            "lines": [[a, b] for a, b in self._parts.lines()],
            "measured": [{"batch_size": m.batch_size, "peak_bytes": m.peak_bytes, "seconds": m.seconds}
                         for m in self.measurements],
            "notes": list(self.notes), "fit_seconds": self.fit_seconds,
        }

    def table(self, at: Iterable[int] | None = None, *, budget_bytes: int | None = None,
              budget_explanation: str | None = None) -> str:
        """A printable table: the measured probes, forecasts at ``at``, the fit and the budget.

        Args:
            at: Batch sizes to forecast; None: the largest that fits the budget.
            budget_bytes: The budget line's budget; None: :meth:`budget`.
            budget_explanation: Where ``budget_bytes`` comes from, for the budget line.
        """
        return format_table(self, at=at, budget_bytes=budget_bytes, budget_explanation=budget_explanation)

    def to_markdown(self, at: Iterable[int] | None = None, *, budget_bytes: int | None = None,
                    budget_explanation: str | None = None, in_use: int | None = None) -> str:
        """The table and the JSON summary (with ``in_use``, the batch size chosen), for a
        TensorBoard text entry (tag ``Memory/Forecast``, which the analysis hints read)."""
        return to_markdown(self, at=at, budget_bytes=budget_bytes, budget_explanation=budget_explanation,
                           in_use=in_use)

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        return (f"Forecast(device={self.device!r}, batch_sizes={self.batch_sizes}, "
                f"fixed_bytes={self.fixed_bytes:.0f}, bytes_per_sample={self.bytes_per_sample:.0f}, "
                f"mode={self.quality.mode!r}, good={self.quality.good})")


def _as_list(obj: Any, kind: type) -> list[Any]:
    if obj is None:
        return []
    items = [obj] if isinstance(obj, kind) else list(obj)
    for item in items:
        if not isinstance(item, kind):
            raise TypeError(f"expected {kind.__name__} objects, got {type(item).__name__}")
    return items


def _resolve_device(device: Any, models: list[torch.nn.Module], make_batch: Callable[[int], Any],
                    n: int) -> torch.device:
    if device is not None:
        d = torch.device(device)
    else:
        found = next((p.device for m in models for p in m.parameters()), None)
        if found is not None:
            d = found
        else:
            from tbmem._internal.forecast.measure import _tensors

            d = next((t.device for t in _tensors(make_batch(n))), torch.device("cpu"))
    if d.type == "cuda" and d.index is None:
        d = torch.device("cuda", torch.cuda.current_device())
    return d


def _check_sizes(batch_sizes: Iterable[int]) -> list[int]:
    sizes = sorted(set(check_n(n) for n in batch_sizes))
    if len(sizes) < 2:
        raise ValueError(f"fit needs at least two different batch sizes, got {list(batch_sizes)!r}")
    return sizes


def _relative(pred: float, meas: float) -> float:
    return pred / meas - 1.0 if meas > 0 else 0.0


def fit(step: Callable[[Any], Any], make_batch: Callable[[int], Any],
        batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES, device: str | torch.device | None = None, *,
        model: torch.nn.Module | Iterable[torch.nn.Module] | None = None,
        optimizer: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] | None = None,
        warmup: int = 1, tolerance: float = DEFAULT_TOLERANCE, progress: bool = False) -> Forecast:
    """Measure ``step`` at a few small batch sizes and fit its peak memory.

    Each probe builds ``make_batch(n)`` and runs ``step(batch)`` once, recorded (on CUDA
    after one unrecorded step at that size). Before probing, ``warmup`` steps at the
    smallest size create what the first step creates lazily (optimizer state, gradients,
    lazily built modules), so that the fixed part is the steady state's.

    Args:
        step: One full training step on a batch (forward, backward, optimizer step).
        make_batch: Builds a batch of ``n`` samples (on the CPU as a DataLoader would, or on
            the device; either way the step sees it as it will in training).
        batch_sizes: Two or more sizes to probe; three let the fit check itself.
        device: Where the step's memory is measured; None: the model's device, else the
            batch's, else the CPU.
        model: The model(s), so their parameters, gradients and buffers are named.
        optimizer: The optimizer(s), so their state is named and its frees are seen.
        warmup: Steps at the smallest size before measuring.
        tolerance: Relative error of a good fit (see :class:`FitQuality`).
        progress: Show a progress bar (tqdm, on stderr) over the probes.

    Returns:
        The :class:`Forecast`.

    Raises:
        ValueError: fewer than two batch sizes, a size < 1, ``warmup < 0``.
        ForecastError: a probe ran out of memory.
    """
    sizes = _check_sizes(batch_sizes)
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an integer >= 0, got {warmup!r}")
    if not 0 < tolerance < 1:
        raise ValueError(f"tolerance must be in (0, 1), got {tolerance!r}")
    models = _as_list(model, torch.nn.Module)
    optimizers = _as_list(optimizer, torch.optim.Optimizer)
    start = time.perf_counter()
    dev = _resolve_device(device, models, make_batch, sizes[0])
    runner = Runner(step, make_batch, dev, models, optimizers)
    for _ in range(warmup):
        runner.run(sizes[0])
    with incremental_census():
        measurements = [runner.measure(n) for n in probes(sizes, progress)]
    parts = fit_parts(measurements)
    fit_err = max(abs(_relative(parts.predict(m.batch_size), m.peak_bytes)) for m in measurements)
    holdout = None
    if len(measurements) >= 3:
        held = fit_parts(measurements[:-1])
        holdout = _relative(held.predict(sizes[-1]), measurements[-1].peak_bytes)
    quality = FitQuality(mode=parts.mode, fit_error=fit_err, holdout_error=holdout,
                         nonlinearity=parts.nonlinearity, tolerance=tolerance)
    notes = _notes(quality, measurements, models, optimizers, sizes)
    for m in measurements:
        m.drop_events()
    forecast = Forecast(device=device_name(dev), measurements=measurements, parts=parts, quality=quality,
                        notes=notes, fit_seconds=time.perf_counter() - start, runner=runner)
    for note in notes:
        logger.warning("tbmem forecast: %s", note)
    return forecast


def _notes(q: FitQuality, ms: list[StepMeasurement], models: list[Any], optimizers: list[Any],
           sizes: list[int]) -> list[str]:
    notes = []
    if q.holdout_error is None:
        notes.append("fitted on two batch sizes: nothing checks that the peak is linear in the batch size; "
                     "probe three")
    elif not q.good:
        notes.append(f"the peak is not linear in the batch size over {sizes}: fitted without {sizes[-1]}, the "
                     f"forecast for it is off by {q.holdout_error:+.1%} (error at the probed sizes "
                     f"{q.fit_error:.1%}); forecasts far beyond {sizes[-1]} are uncertain: probe sizes closer "
                     "to the one you need, or check one with Forecast.measure(n)")
    if q.mode == "phases":
        notes.append("the steps ran different operator sequences at different batch sizes; each phase's peak "
                     "(forward, backward, no-grad code) was fitted instead of every allocation")
    elif q.mode == "peaks":
        notes.append("the steps ran different operator sequences and phases at different batch sizes; only "
                     "their peaks were fitted, so a change of the phase that holds the peak is not foreseen")
    if not models:
        notes.append("no model given: parameters are found by a heap scan; pass model= to name them and "
                     "their gradients")
    if not optimizers:
        notes.append("no optimizer given: its state counts as 'other' and gradients it frees are not seen; "
                     "pass optimizer=")
    return notes
