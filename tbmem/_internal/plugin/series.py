"""Scalars from TensorBoard's data provider as numpy arrays, cached, and thinned for drawing.

:class:`ScalarCache` reads a run's time series through ``context.data_provider`` (never
the event files) and keeps them as arrays until TensorBoard's listing shows the series
changed (its last step or wall time). :func:`minmax_indices` thins a series for a chart
of a given width by keeping, per bucket of steps, the records with the lowest and the
highest value: every drawn point is a real record and no peak is lost. The exact
value at any step comes from the full arrays (:meth:`Series.at`).

Example:
    >>> import numpy as np
    >>> from tbmem._internal.plugin.series import minmax_indices
    >>> values = np.zeros(100_000); values[54_321] = 7.0
    >>> keep = minmax_indices(np.arange(100_000), values, 500)
    >>> len(keep) <= 1000, 54_321 in keep
    (True, True)
"""

from __future__ import annotations

import operator
import threading
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

__all__ = ["Series", "ScalarCache", "minmax_indices", "align"]

_READ_ALL = 1 << 40  # downsample limit meaning "every point TensorBoard holds"
_SLOTS = ("_step", "_value", "_wall_time")


@dataclass(frozen=True)
class Series:
    """One scalar time series: steps ascending, one value per step (the last write wins).

    Example:
        >>> from types import SimpleNamespace as D
        >>> s = Series.from_data([D(step=5, value=2.0, wall_time=1.0), D(step=1, value=1.0, wall_time=0.5)])
        >>> s.steps.tolist(), s.at(5), s.at(3)
        ([1, 5], 2.0, None)
    """

    steps: np.ndarray
    values: np.ndarray
    wall_times: np.ndarray

    @classmethod
    def from_data(cls, data: Iterable[Any]) -> "Series":
        """From the provider's ``ScalarDatum`` list."""
        data = list(data)
        # ScalarDatum's slots read in C are 4x faster than its properties on 100k points
        fields = _SLOTS if data and all(hasattr(data[0], f) for f in _SLOTS) else ("step", "value", "wall_time")
        n = len(data)
        steps = np.fromiter(map(operator.attrgetter(fields[0]), data), dtype=np.int64, count=n)
        values = np.fromiter(map(operator.attrgetter(fields[1]), data), dtype=np.float64, count=n)
        walls = np.fromiter(map(operator.attrgetter(fields[2]), data), dtype=np.float64, count=n)
        order = np.argsort(steps, kind="stable")
        steps, values, walls = steps[order], values[order], walls[order]
        if len(steps) > 1 and not np.all(steps[1:] != steps[:-1]):
            last = np.append(steps[1:] != steps[:-1], True)  # a rewritten step: keep its last write
            steps, values, walls = steps[last], values[last], walls[last]
        return cls(steps, values, walls)

    def at(self, step: int) -> float | None:
        """The value logged at exactly ``step``, or None."""
        i = int(np.searchsorted(self.steps, step))
        if i < len(self.steps) and self.steps[i] == step:
            return float(self.values[i])
        return None


class ScalarCache:
    """Per-(experiment, run, tag) arrays, re-read when TensorBoard's listing shows new data.

    Args:
        provider: ``context.data_provider``.

    Example:
        >>> import tempfile
        >>> from tensorboard import context
        >>> from tensorboard.backend.event_processing.data_provider import MultiplexerDataProvider
        >>> from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer
        >>> from tbmem import MemoryWriter
        >>> logdir = tempfile.mkdtemp()
        >>> with MemoryWriter(f"{logdir}/r", custom_layout=False) as w:
        ...     w.write_scalars({"Memory/RAM/process_rss_GB": 1.5}, step=3)
        >>> mux = EventMultiplexer().AddRunsFromDirectory(logdir).Reload()
        >>> cache = ScalarCache(MultiplexerDataProvider(mux, logdir))
        >>> cache.get(context.RequestContext(), "", "r", ["Memory/RAM/process_rss_GB"])["Memory/RAM/process_rss_GB"].at(3)
        1.5
    """

    def __init__(self, provider: Any) -> None:
        self._provider = provider
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, str, str], tuple[tuple[Any, Any], Series]] = {}

    def listing(self, ctx: Any, eid: str, runs: list[str] | None = None) -> dict[str, dict[str, Any]]:
        """run -> tag -> ScalarTimeSeries for the scalars of ``runs`` (every run when None)."""
        from tensorboard.data import provider as tbp

        return self._provider.list_scalars(ctx, experiment_id=eid, plugin_name="scalars",
                                           run_tag_filter=tbp.RunTagFilter(runs=runs))

    def get(self, ctx: Any, eid: str, run: str, tags: Iterable[str],
            listing: dict[str, Any] | None = None) -> dict[str, Series]:
        """The complete series of ``tags`` in ``run`` (tags the run lacks are left out)."""
        return self.get_sampled(ctx, eid, run, tags, listing=listing)[0]

    def get_sampled(self, ctx: Any, eid: str, run: str, tags: Iterable[str], *,
                    listing: dict[str, Any] | None = None, sample: int | None = None) -> tuple[dict[str, Series], set[str]]:
        """Like :meth:`get`; with ``sample``, a series not cached yet is read as at most ``sample``
        records, evenly at random (the data provider's own downsampling, cheap on the Rust server).

        Returns the series and the tags that are samples. A read that came back shorter than
        ``sample`` is the complete series and is cached like any other.
        """
        from tensorboard.data import provider as tbp

        if listing is None:
            listing = self.listing(ctx, eid, [run]).get(run, {})
        wanted = [t for t in dict.fromkeys(tags) if t in listing]
        out: dict[str, Series] = {}
        stale = []
        with self._lock:
            for tag in wanted:
                hit = self._cache.get((eid, run, tag))
                if hit is not None and hit[0] == _signature(listing[tag]):
                    out[tag] = hit[1]
                else:
                    stale.append(tag)
        sampled: set[str] = set()
        if stale:
            limit = _READ_ALL if sample is None else sample
            data = self._provider.read_scalars(ctx, experiment_id=eid, plugin_name="scalars", downsample=limit,
                                               run_tag_filter=tbp.RunTagFilter(runs=[run], tags=stale))
            fresh = {tag: points for tag, points in data.get(run, {}).items()}
            with self._lock:
                for tag, points in fresh.items():
                    series = Series.from_data(points)
                    out[tag] = series
                    if len(points) >= limit:
                        sampled.add(tag)
                    else:
                        self._cache[(eid, run, tag)] = (_signature(listing[tag]), series)
        return out, sampled


def _signature(ts: Any) -> tuple[Any, Any]:
    return ts.max_step, ts.max_wall_time


def minmax_indices(steps: np.ndarray, values: np.ndarray, buckets: int) -> np.ndarray:
    """Indices to draw: per equal-width step bucket, the lowest and highest record (and the ends)."""
    n = len(steps)
    if n <= 2 * buckets:
        return np.arange(n)
    lo, hi = float(steps[0]), float(steps[-1])
    b = np.minimum(((steps - lo) / max(hi - lo, 1.0) * buckets).astype(np.int64), buckets - 1)
    starts = np.flatnonzero(np.r_[True, b[1:] != b[:-1]])
    # NaN-safe min/max per bucket; reduceat works on contiguous runs, and steps are sorted
    v = np.where(np.isnan(values), -np.inf, values)
    imax = _arg_reduce(v, starts, np.maximum)
    v = np.where(np.isnan(values), np.inf, values)
    imin = _arg_reduce(v, starts, np.minimum)
    return np.unique(np.concatenate([imin, imax, [0, n - 1]]))


def _arg_reduce(v: np.ndarray, starts: np.ndarray, ufunc: Any) -> np.ndarray:
    best = ufunc.reduceat(v, starts)
    seg = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, len(v)]))
    hit = np.flatnonzero(v == best[seg])
    first = np.unique(seg[hit], return_index=True)[1]  # first record reaching the extreme
    return hit[first]


def align(columns: dict[str, tuple[np.ndarray, np.ndarray]]) -> tuple[list[int], dict[str, list[float | None]]]:
    """One shared x (the union of the steps) and each column's values on it (None where absent)."""
    if not columns:
        return [], {}
    x = np.unique(np.concatenate([s for s, _ in columns.values()]))
    out: dict[str, list[float | None]] = {}
    for key, (steps, values) in columns.items():
        col = np.full(len(x), np.nan)
        col[np.searchsorted(x, steps)] = values
        out[key] = [None if not np.isfinite(v) else float(v) for v in col]
    return x.tolist(), out
