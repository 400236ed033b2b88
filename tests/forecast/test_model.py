"""The fit's math: least-squares lines and their upper envelope, against brute force."""

from __future__ import annotations

import numpy as np
import pytest

from tbmem._internal.forecast.model import Envelope, fit_lines, phase_points


def test_fit_lines_recovers_lines_and_reports_residuals():
    sizes = np.array([16.0, 32.0, 64.0])
    values = np.stack([3.0 + 2.0 * sizes, 7.0 + 0.0 * sizes, sizes**2], axis=1)
    a, b, worst = fit_lines(sizes, values)
    assert a[:2] == pytest.approx([3.0, 7.0]) and b[:2] == pytest.approx([2.0, 0.0], abs=1e-12)
    assert worst[0] == pytest.approx(0.0, abs=1e-9) and worst[1] == pytest.approx(0.0, abs=1e-9)
    assert worst[2] > 100  # a parabola is not a line: the residual says so


@pytest.mark.parametrize("seed", range(20))
def test_envelope_equals_the_maximum_of_all_lines(seed):
    rng = np.random.default_rng(seed)
    a = rng.normal(0, 1000, size=200)
    b = rng.normal(0, 10, size=200)
    b[:20] = b[0]  # equal slopes must not confuse the hull
    env = Envelope.from_lines(a, b)
    assert len(env.index) <= len(a)
    for n in [1, 2, 3, 10, 64, 100, 1024, 10**6]:
        brute = np.max(a + b * n)
        assert env.at(n) == pytest.approx(brute)
        j = env.argmax(n)
        assert a[j] + b[j] * n == pytest.approx(brute)


def test_envelope_keeps_the_optimizer_phase_at_small_sizes_and_backward_at_large():
    # the optimizer step holds 500 B whatever the batch; the backward pass 10 B per sample
    env = Envelope.from_lines(np.array([500.0, 0.0]), np.array([0.0, 10.0]))
    assert env.at(16) == 500.0 and env.at(1024) == pytest.approx(10240.0)
    assert env.argmax(16) == 0 and env.argmax(1024) == 1


def test_phase_points_pick_each_phase_peak_and_refuse_different_phases():
    labels = [np.array([1, 1, 2, 2, 3]), np.array([1, 1, 1, 2, 2, 2, 3])]
    nets = [np.array([5, 9, 4, 12, 1]), np.array([5, 9, 11, 4, 12, 13, 1])]
    idx = phase_points(labels, nets)
    assert [list(i) for i in idx] == [[1, 3, 4], [2, 5, 6]]
    assert phase_points([np.array([1, 2]), np.array([2, 1])], [np.array([1, 1]), np.array([1, 1])]) is None
