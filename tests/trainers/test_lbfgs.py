"""trainers.lbfgs: SciPy's L-BFGS-B iterations observed through a callback chained to the caller's own."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.optimize

from trainers.lbfgs import IterationObserver


def _rosen(x):
    return float(scipy.optimize.rosen(x)), scipy.optimize.rosen_der(x)


def test_the_callers_callback_still_runs_and_the_counts_are_scipys():
    theirs, ours = [], []
    with IterationObserver(ours.append) as obs:
        res = scipy.optimize.minimize(_rosen, np.zeros(4), jac=True, method="L-BFGS-B",
                                      callback=lambda x: theirs.append(np.copy(x)))
    assert len(theirs) == len(ours) == res.nit > 10  # chained: the caller's callback saw every iteration
    assert np.array_equal(theirs[-1], res.x)
    assert [it.number for it in ours] == list(range(1, res.nit + 1))
    assert ours[-1].evaluations <= res.nfev and obs.results == [res]
    assert ours[-1].loss == pytest.approx(res.fun)
    assert ours[-1].grad_norm == pytest.approx(np.linalg.norm(res.jac))
    assert scipy.optimize.minimize.__module__ == "scipy.optimize._minimize"  # restored


def test_other_methods_and_calls_outside_the_block_pass_through():
    seen = []
    with IterationObserver(seen.append) as obs:
        scipy.optimize.minimize(_rosen, np.zeros(2), jac=True, method="BFGS")
    scipy.optimize.minimize(_rosen, np.zeros(2), jac=True, method="L-BFGS-B")
    assert seen == [] and obs.results == []


def test_a_failing_observer_never_reaches_scipy(tbmem_log):
    def broken(it):
        raise RuntimeError("observer exploded")

    theirs = []
    with IterationObserver(broken):
        res = scipy.optimize.minimize(_rosen, np.zeros(3), jac=True, method="L-BFGS-B",
                                      callback=lambda x: theirs.append(1))
    assert res.success and len(theirs) == res.nit  # the solve went on; the caller's callback every time
    messages = [r.getMessage() for r in tbmem_log.records if "L-BFGS-B iterations failed" in r.getMessage()]
    assert len(messages) == 1 and "observer exploded" in messages[0]


@pytest.mark.parametrize("problem", ["rosenbrock", "least_squares"])
def test_the_iterates_gradient_norm_jumps_by_design(problem):
    """Why the spike detector does not watch LBFGS/grad_norm by default: on problems L-BFGS-B solves
    without trouble, the gradient norm at its iterates rises above 2x its rolling median."""
    from tbmem._internal.spikes import SpikeConfig, SpikeDetector

    if problem == "rosenbrock":
        fun, x0 = _rosen, np.zeros(10)
    else:
        rng = np.random.default_rng(0)
        a = rng.standard_normal((50, 20)) @ np.diag(np.logspace(0, 4, 20))
        b = rng.standard_normal(50)
        fun, x0 = (lambda x: (float(((a @ x - b) ** 2).sum()), 2 * a.T @ (a @ x - b))), np.zeros(20)
    seen = []
    with IterationObserver(seen.append):
        res = scipy.optimize.minimize(fun, x0, jac=True, method="L-BFGS-B", options={"maxiter": 300})
    assert res.nit > 50
    watching = SpikeDetector(SpikeConfig(exclude=()))
    flagged = [it.number for it in seen if watching.update("LBFGS/grad_norm", it.number, it.grad_norm)]
    assert flagged  # the rule would call these spikes
    assert not [it.number for it in seen if watching.update("Loss/iteration", it.number, it.loss)]  # monotone
    assert not SpikeDetector(SpikeConfig()).watches("LBFGS/grad_norm")
