"""Thinning for drawing keeps every peak and only real records; series from the provider are deduplicated."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from tbmem._internal.plugin.series import Series, align, minmax_indices


def test_minmax_keeps_every_bucket_extreme_and_the_ends():
    rng = np.random.default_rng(0)
    steps = np.arange(0, 1_000_000, 10)
    values = rng.normal(size=len(steps))
    keep = minmax_indices(steps, values, 400)
    assert len(keep) <= 2 * 400 + 2 and keep[0] == 0 and keep[-1] == len(steps) - 1
    assert np.all(np.diff(keep) > 0)
    assert values.argmax() in keep and values.argmin() in keep
    # in every bucket, the highest and lowest record are drawn
    b = np.minimum((steps - steps[0]) * 400 // (steps[-1] - steps[0]), 399)
    for bucket in (0, 17, 399):
        idx = np.flatnonzero(b == bucket)
        assert idx[values[idx].argmax()] in keep and idx[values[idx].argmin()] in keep


def test_minmax_returns_everything_when_it_fits_and_survives_nan():
    assert minmax_indices(np.arange(10), np.zeros(10), 5).tolist() == list(range(10))
    values = np.ones(1000)
    values[500] = np.nan
    values[700] = 5.0
    keep = minmax_indices(np.arange(1000), values, 20)
    assert 700 in keep


def test_series_from_provider_data_sorts_and_keeps_the_last_write():
    data = [SimpleNamespace(step=s, value=v, wall_time=w) for s, v, w in
            [(2, 1.0, 10.0), (1, 5.0, 11.0), (2, 3.0, 12.0), (3, 4.0, 13.0)]]
    s = Series.from_data(data)
    assert s.steps.tolist() == [1, 2, 3] and s.values.tolist() == [5.0, 3.0, 4.0]
    assert s.at(2) == 3.0 and s.at(7) is None


def test_align_puts_columns_on_the_union_of_steps():
    x, cols = align({"a": (np.array([0, 10]), np.array([1.0, 2.0])), "b": (np.array([5]), np.array([np.inf]))})
    assert x == [0, 5, 10] and cols == {"a": [1.0, None, 2.0], "b": [None, None, None]}


def test_series_reads_tensorboards_scalar_datum():
    from tensorboard.data.provider import ScalarDatum

    s = Series.from_data([ScalarDatum(step=7, wall_time=2.5, value=1.25), ScalarDatum(step=3, wall_time=1.0, value=-1.0)])
    assert s.steps.tolist() == [3, 7] and s.values.tolist() == [-1.0, 1.25] and s.wall_times.tolist() == [1.0, 2.5]
    assert s.steps.dtype == np.int64
