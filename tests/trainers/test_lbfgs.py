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
