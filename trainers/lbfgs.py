"""Each L-BFGS-B iteration of PhiML's ``math.minimize``, observed as it happens.

PhiML runs SciPy's ``scipy.optimize.minimize`` in a worker thread per batch item and passes
it a callback of its own, which counts the iterations and keeps the last loss (its
``SolveInfo.iterations``); it keeps per-iteration records only until the solve ends, and
SciPy's ``disp``/``iprint`` output is deprecated since SciPy 1.15. While an
:class:`IterationObserver` is active, ``scipy.optimize.minimize`` (which PhiML imports at each
solve) is a thin wrapper that, for ``method="L-BFGS-B"``:

* chains to PhiML's callback: PhiML's runs first, with the argument SciPy would have given
  it (a copy of the iterate), then the observer's; nothing of PhiML's is replaced;
* wraps the objective PhiML passes, to count its evaluations and keep the gradient of the
  iterate (SciPy hands the callback the iterate and its loss, not its gradient);
* keeps the ``OptimizeResult`` SciPy returns (``nit``, ``nfev``) in :attr:`IterationObserver.results`.

Other methods and calls made outside the ``with`` block go to SciPy unchanged. The
observer's own work never raises into SciPy's worker (an exception there would leave
PhiML's main thread waiting forever on its barrier): a failure is reported once on the
``tbmem`` logger and the observer stops observing.

Example:
    >>> import numpy as np, scipy.optimize
    >>> from trainers.lbfgs import IterationObserver
    >>> seen = []
    >>> def fun(x):
    ...     return float(((x - 3) ** 2).sum()), 2 * (x - 3)
    >>> with IterationObserver(seen.append) as obs:
    ...     res = scipy.optimize.minimize(fun, np.zeros(2), jac=True, method="L-BFGS-B")
    >>> len(seen) == res.nit == obs.results[0].nit, seen[-1].evaluations == res.nfev
    (True, True)
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from tbmem import report_once

__all__ = ["Iteration", "IterationObserver"]

_LOCK = threading.Lock()


@dataclass(frozen=True)
class Iteration:
    """One L-BFGS-B iteration, as SciPy's callback reports it.

    Attributes:
        number: The iteration, from 1 (the last one's number is SciPy's ``nit``).
        loss: The loss at the new iterate (SciPy's ``intermediate_result.fun``).
        grad_norm: The Euclidean norm of the gradient there (from the evaluation at the iterate;
            NaN when no evaluation was at exactly that point).
        evaluations: Loss evaluations of this minimisation so far (SciPy's ``nfev`` at this point).
        seconds: Wall time since the previous iteration (or since the minimisation began).
        solve: Which SciPy minimisation (PhiML starts one per batch item of ``x0``), from 0.
    """

    number: int
    loss: float
    grad_norm: float
    evaluations: int
    seconds: float
    solve: int = 0


class _Solve:
    """The state of one ``scipy.optimize.minimize`` call: its evaluations and iterations."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.evaluations = 0
        self.iterations = 0
        self.last_time = time.perf_counter()
        self.recent: list[tuple[np.ndarray, float, float]] = []  # since the last iteration: (x, loss, |grad|)


class IterationObserver:
    """Observe SciPy's L-BFGS-B iterations inside PhiML's ``math.minimize`` (a context manager).

    Args:
        on_iteration: Called with each :class:`Iteration`, on SciPy's worker thread while PhiML's
            main thread waits for it. It should not raise; if it does, the failure is reported once
            and the observer stops calling it.

    Attributes:
        iterations: Every :class:`Iteration` seen, in order.
        results: SciPy's ``OptimizeResult`` of each L-BFGS-B minimisation that ended in the block.
    """

    def __init__(self, on_iteration: Callable[[Iteration], None] | None = None) -> None:
        self.on_iteration = on_iteration
        self.iterations: list[Iteration] = []
        self.results: list[Any] = []
        self._solves = 0
        self._original: Any = None
        self._active = False
        self._patch = self._minimize  # one bound method: what __exit__ finds installed

    # --- the patch ------------------------------------------------------------------------------
    def __enter__(self) -> "IterationObserver":
        import scipy.optimize

        with _LOCK:
            self._original = scipy.optimize.minimize
            scipy.optimize.minimize = self._patch
            self._active = True
        return self

    def __exit__(self, *exc: object) -> None:
        import scipy.optimize

        with _LOCK:
            self._active = False
            if scipy.optimize.minimize is self._patch:
                scipy.optimize.minimize = self._original
            else:  # another wrapper was installed over this one: bypass this one from now on
                report_once("trainers:lbfgs-unpatch", "trainers: scipy.optimize.minimize was replaced while "
                            "L-BFGS-B iterations were observed; the observer now passes every call through")

    def _minimize(self, fun: Any, x0: Any, *args: Any, **kwargs: Any) -> Any:
        original = self._original
        method = kwargs.get("method", args[2] if len(args) > 2 else None)
        if not self._active or not isinstance(method, str) or method.lower() != "l-bfgs-b":
            return original(fun, x0, *args, **kwargs)
        with _LOCK:
            solve = _Solve(self._solves)
            self._solves += 1
        kwargs["callback"] = self._chain(kwargs.get("callback"), solve)
        result = original(self._counted(fun, solve), x0, *args, **kwargs)
        self.results.append(result)
        return result

    # --- the objective and the callback ---------------------------------------------------------
    def _counted(self, fun: Any, solve: _Solve) -> Callable[..., Any]:
        def counted(x: Any, *args: Any) -> Any:
            out = fun(x, *args)  # PhiML's: an exception from it is PhiML's behaviour, passed on unchanged
            solve.evaluations += 1
            try:
                if isinstance(out, tuple) and len(out) == 2:
                    loss, grad = float(np.asarray(out[0])), float(np.linalg.norm(np.asarray(out[1], dtype=float)))
                else:
                    loss, grad = float(np.asarray(out)), float("nan")
                solve.recent.append((np.array(x, dtype=float, copy=True), loss, grad))
            except Exception as exc:  # noqa: BLE001 - never into SciPy's worker (module docstring)
                self._failed(exc)
            return out

        return counted

    def _chain(self, phiml_callback: Any, solve: _Solve) -> Callable[..., Any]:
        def chained(intermediate_result: Any) -> None:
            # SciPy >= 1.11 passes an OptimizeResult (x, fun) to a callback whose only parameter has
            # this name; PhiML's callback takes the iterate, which is what SciPy would have passed it.
            x = getattr(intermediate_result, "x", intermediate_result)
            if phiml_callback is not None:
                phiml_callback(np.copy(x))
            if self._active:
                try:
                    self._iteration(solve, x, getattr(intermediate_result, "fun", None))
                except Exception as exc:  # noqa: BLE001 - never into SciPy's worker (module docstring)
                    self._failed(exc)

        return chained

    def _iteration(self, solve: _Solve, x: Any, fun: Any) -> None:
        now = time.perf_counter()
        solve.iterations += 1
        x = np.asarray(x, dtype=float)
        grad = float("nan")
        for seen_x, loss, g in reversed(solve.recent):  # the evaluation at the iterate: the line search's last
            if seen_x.shape == x.shape and np.array_equal(seen_x, x):
                grad = g
                if fun is None:
                    fun = loss
                break
        if fun is None:  # PhiML's own rule: the lowest loss since the previous iteration
            fun = min((loss for _, loss, _ in solve.recent), default=float("nan"))
        solve.recent = []
        it = Iteration(number=solve.iterations, loss=float(fun), grad_norm=grad, evaluations=solve.evaluations,
                       seconds=now - solve.last_time, solve=solve.index)
        solve.last_time = now
        self.iterations.append(it)
        if self.on_iteration is not None:
            self.on_iteration(it)

    def _failed(self, exc: Exception) -> None:
        report_once("trainers:lbfgs", "trainers: observing the L-BFGS-B iterations failed; it is off", exc=exc)
        self._active = False
