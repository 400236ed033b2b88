"""Straight lines through a step's measurements: what was alive before it, and the step's aligned points.

:func:`fit_parts` turns :class:`~tbmem.forecast.StepMeasurement` objects (one per probed
batch size) into :class:`Parts`: a line per category alive before the step, the upper envelope of
the lines through the step's aligned points (see :mod:`tbmem._internal.forecast.model`), the categories at
each envelope line, and on CUDA the allocator's overhead.

Example:
    >>> import torch
    >>> from tbmem._internal.forecast.measure import measure_step
    >>> from tbmem._internal.forecast.parts import fit_parts
    >>> def step(x):
    ...     (x * 2).sum()
    >>> ms = [measure_step(step, torch.ones(n, 256), device=torch.device("cpu"), batch_size=n) for n in (4, 8)]
    >>> parts = fit_parts(ms)
    >>> parts.mode, round(parts.predict(100) - parts.predict(99))  # a batch row and its double: 2 x 1 KiB
    ('aligned', 2048)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from tbmem._internal.forecast.measure import BEFORE_CATEGORIES, STEP_CATEGORIES, StepMeasurement
from tbmem._internal.forecast.model import Envelope, aligned_points, fit_lines, phase_points

__all__ = ["Parts", "fit_parts"]


@dataclass(frozen=True)
class Parts:
    """The fitted lines of a forecast.

    Attributes:
        sizes: The probed batch sizes.
        before: Category alive before the step -> ``(a, b)`` of its line.
        envelope: The upper envelope of the step's lines.
        step_a: Intercepts by step category (rows) and envelope line (columns).
        step_b: Slopes, the same way.
        overhead: CUDA allocator bytes the recorder does not explain, ``(a, b)``.
        mode: ``"aligned"``, ``"phases"`` or ``"peaks"`` (see :class:`tbmem.forecast.FitQuality`).
        nonlinearity: Largest residual of a fitted point over the largest measured peak.
    """

    sizes: np.ndarray
    before: dict[str, tuple[float, float]]
    envelope: Envelope
    step_a: np.ndarray
    step_b: np.ndarray
    overhead: tuple[float, float]
    mode: str
    nonlinearity: float

    def _base(self) -> tuple[float, float]:
        a0 = sum(a for a, _ in self.before.values()) + self.overhead[0]
        b0 = sum(b for _, b in self.before.values()) + self.overhead[1]
        return a0, b0

    def predict(self, n: float) -> float:
        """The forecast peak at batch size ``n``."""
        a0, b0 = self._base()
        return a0 + b0 * n + self.envelope.at(n)

    def lines(self) -> list[tuple[float, float]]:
        """The forecast as ``max(a + b n)`` over these total lines."""
        a0, b0 = self._base()
        return [(a0 + float(a), b0 + float(b)) for a, b in zip(self.envelope.a, self.envelope.b)]


def _points(ms: Sequence[StepMeasurement]) -> tuple[np.ndarray, np.ndarray, str]:
    """(k x J net bytes, k x C x J bytes by category, mode) at points aligned across probes."""
    if aligned_points([m.signature for m in ms]):
        nets = [m.net for m in ms]
        cats = [m.by_category for m in ms]
        mode = "aligned"
    else:
        idx = phase_points([m.phases for m in ms], [m.net for m in ms])
        if idx is None:
            idx = [np.array([int(np.argmax(m.net))] if m.net.size else [], dtype=np.int64) for m in ms]
            mode = "peaks"
        else:
            mode = "phases"
        nets = [m.net[i] for m, i in zip(ms, idx)]
        cats = [m.by_category[:, i] for m, i in zip(ms, idx)]
    # a zero point: before the step's first event, nothing is added yet
    y = np.stack([np.concatenate([[0], n]) for n in nets]).astype(float)
    c = np.stack([np.concatenate([np.zeros((len(STEP_CATEGORIES), 1)), x], axis=1) for x in cats]).astype(float)
    return y, c, mode


def fit_parts(ms: Sequence[StepMeasurement]) -> Parts:
    """Fit lines through measurements at two or more batch sizes."""
    sizes = np.array([m.batch_size for m in ms], dtype=float)
    before = {}
    for cat in BEFORE_CATEGORIES:
        a, b, _ = fit_lines(sizes, np.array([[m.before.get(cat, 0)] for m in ms], dtype=float))
        before[cat] = (float(a[0]), float(b[0]))
    y, c, mode = _points(ms)
    a, b, resid = fit_lines(sizes, y)
    env = Envelope.from_lines(a, b)
    ca, cb, _ = fit_lines(sizes, c[:, :, env.index].reshape(len(ms), -1))
    shape = (len(STEP_CATEGORIES), len(env.index))
    oa, ob, _ = fit_lines(sizes, np.array([[m.allocator_overhead_bytes] for m in ms], dtype=float))
    scale = max(max(m.peak_bytes for m in ms), 1)
    return Parts(sizes=sizes, before=before, envelope=env, step_a=ca.reshape(shape), step_b=cb.reshape(shape),
                 overhead=(float(oa[0]), float(ob[0])), mode=mode,
                 nonlinearity=float(resid.max()) / scale if resid.size else 0.0)
