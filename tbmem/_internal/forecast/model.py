"""The fit: straight lines in the batch size through aligned points of the step, and their upper envelope.

A training step runs the same operators whatever the batch size; only the sizes of
their outputs change. So the bytes alive after the *i*-th allocation or free of the
step are, for most steps, a straight line in the batch size ``n``: ``a_i + b_i n``
(``b_i`` counts activations and temporaries, ``a_i`` everything that does not scale:
gradients, optimizer temporaries, workspaces). The step's peak is the highest of
these lines, which is *not* one straight line: at small ``n`` the optimizer's step
(constant in ``n``) may hold the peak, at large ``n`` the backward pass (growing with
``n``). Fitting one line through the peaks of small batches extrapolates the wrong
phase; fitting each aligned point and taking the upper envelope does not.

Points are aligned when every probed size produced the same sequence of events
(same allocation/free order and categories). Otherwise the step is cut into phases
(runs of allocations made in the forward, backward or no-grad code) and each phase's
peak is fitted; if even the phases differ, only the peaks are.

Example:
    >>> import numpy as np
    >>> from tbmem._internal.forecast.model import fit_lines, Envelope
    >>> sizes = np.array([16.0, 32.0, 64.0])
    >>> # two points of a step: the optimizer step (constant) and the backward pass (10 B/sample)
    >>> values = np.array([[500.0, 160.0], [500.0, 320.0], [500.0, 640.0]])
    >>> a, b, worst = fit_lines(sizes, values)
    >>> env = Envelope.from_lines(a, b)
    >>> round(env.at(16)), round(env.at(1024))
    (500, 10240)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["fit_lines", "Envelope", "aligned_points", "phase_points"]


def fit_lines(sizes: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Least-squares lines ``a + b * n`` through each column of ``values``.

    Args:
        sizes: ``(k,)`` batch sizes, at least two distinct.
        values: ``(k, m)`` one row per size.

    Returns:
        ``a`` and ``b`` of shape ``(m,)``, and each column's largest absolute residual. Slopes
        below ``1e-6`` (bytes per sample: rounding noise of a constant) are exactly zero.
    """
    x = np.asarray(sizes, dtype=float)
    y = np.asarray(values, dtype=float)
    design = np.stack([np.ones_like(x), x], axis=1)
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    residual = np.abs(design @ coef - y).max(axis=0) if y.size else np.zeros(y.shape[1:])
    a, b = coef[0], coef[1]
    flat = np.abs(b) < 1e-6
    if flat.any():
        b = np.where(flat, 0.0, b)
        a = np.where(flat, y.mean(axis=0), a)
    return a, b, residual


@dataclass(frozen=True)
class Envelope:
    """The upper envelope ``max_j (a_j + b_j n)`` over ``n >= 1``, as the few lines that form it.

    Attributes:
        a: Intercepts of the envelope's lines, by increasing slope.
        b: Their slopes.
        index: For each line, the column of the original lines it came from.
    """

    a: np.ndarray
    b: np.ndarray
    index: np.ndarray

    @classmethod
    def from_lines(cls, a: np.ndarray, b: np.ndarray) -> "Envelope":
        """Keep only the lines that are the maximum somewhere in ``n >= 1`` (a convex hull)."""
        a = np.asarray(a, dtype=float)
        b = np.asarray(b, dtype=float)
        order = np.lexsort((a, b))  # by slope, then intercept
        hull: list[int] = []
        for j in order:
            # equal slopes: the later (higher intercept) line dominates
            while hull and b[hull[-1]] == b[j]:
                hull.pop()
            while len(hull) >= 2 and _useless(a, b, hull[-2], hull[-1], j):
                hull.pop()
            hull.append(int(j))
        # lines whose region ends before n = 1 never matter
        while len(hull) >= 2 and _cross(a, b, hull[0], hull[1]) <= 1.0:
            hull.pop(0)
        idx = np.asarray(hull, dtype=np.int64)
        return cls(a=a[idx], b=b[idx], index=idx)

    def at(self, n: float) -> float:
        """The envelope's value at ``n``."""
        return float(np.max(self.a + self.b * n))

    def argmax(self, n: float) -> int:
        """Which original column holds the maximum at ``n``."""
        return int(self.index[int(np.argmax(self.a + self.b * n))])


def _cross(a: np.ndarray, b: np.ndarray, i: int, j: int) -> float:
    """Where line ``j`` (steeper) overtakes line ``i``."""
    return float((a[i] - a[j]) / (b[j] - b[i]))


def _useless(a: np.ndarray, b: np.ndarray, i: int, j: int, k: int) -> bool:
    """Line ``j`` (slope between ``i`` and ``k``) is never above both of its neighbours."""
    return (a[k] - a[i]) * (b[j] - b[i]) >= (a[j] - a[i]) * (b[k] - b[i])


def aligned_points(signatures: list[bytes]) -> bool:
    """Whether every probed step produced the same event sequence."""
    return all(s == signatures[0] for s in signatures[1:])


def phase_points(labels: list[np.ndarray], nets: list[np.ndarray]) -> list[np.ndarray] | None:
    """For each probe, the event index of each phase's peak; None when the phases differ.

    Args:
        labels: Per probe, the phase label of each event (forward, backward, no-grad ...).
        nets: Per probe, the net bytes after each event.
    """
    bounds = []
    for lab in labels:
        change = np.flatnonzero(np.diff(lab)) + 1 if lab.size else np.zeros(0, dtype=np.int64)
        bounds.append(np.concatenate([[0], change, [lab.size]]).astype(np.int64))
    runs = [tuple(lab[b[:-1]]) for lab, b in zip(labels, bounds)]
    if any(r != runs[0] for r in runs[1:]):
        return None
    out = []
    for b, net in zip(bounds, nets):
        out.append(np.array([lo + int(np.argmax(net[lo:hi])) for lo, hi in zip(b[:-1], b[1:])],
                            dtype=np.int64))
    return out
