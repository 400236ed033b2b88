"""PhysicalTrainer: recover a PDE coefficient (and optionally the initial state) with L-BFGS-B.

The ground truth is the first ``num_predict_steps + 1`` frames of the
simulations ``trainer_params.train_sim``. The loss rolls the same PhiFlow step
that generated them forward from the initial state and sums the L2 distance
to every observed frame; ``math.minimize`` runs SciPy's L-BFGS-B on it with
``suppress=(math.NotConverged,)`` so the iteration limit returns the result
instead of raising. Coefficients are optimised as logarithms (L-BFGS-B here
has no bounds and they must stay positive).

Nothing inside the loss function may raise: SciPy's worker would wait
forever. So monitoring there goes through the non-raising
:meth:`TrainerMonitoring.on_evaluation`, and the objective is evaluated once
before ``minimize``, where an error in the physics still raises normally.

The escape, for an error in a later evaluation and for Ctrl-C: during ``minimize``
the first Ctrl-C only sets a flag (:func:`tbmem.deferred_interrupt`); an
exception inside the objective is caught and kept. From then on the loss returns
a very low, flat value (gradient zero) without evaluating anything, so L-BFGS-B's
line search accepts it and its projected-gradient test ends the run within an
evaluation or two; SciPy's threads exit, and the kept exception (the original
object, or ``KeyboardInterrupt``) is raised from :meth:`PhysicalTrainer.train`.
A second Ctrl-C flushes the event files and exits at once with status 130.

Example:
    >>> import tempfile
    >>> from trainers.config import validate
    >>> from trainers.monitoring import TrainerMonitoring
    >>> from trainers.physical import PhysicalTrainer
    >>> cfg = validate({"experiment": "doc", "trainer_type": "physical",
    ...     "data": {"resolution": 32, "num_frames": 5, "num_sims": 1, "cache_dir": tempfile.mkdtemp(),
    ...              "progress": False, "nu": 0.05},
    ...     "trainer_params": {"train_sim": [0], "learnable_parameters": [
    ...         {"name": "viscosity", "initial_guess": 0.02}], "abs_tol": 1e-10}})
    >>> mon = TrainerMonitoring.create(tempfile.mkdtemp(), enabled=False, verbose_batches=0,
    ...                                tbmem_config=cfg.tbmem)
    >>> result = PhysicalTrainer(cfg, monitoring=mon).train(); mon.close()  # doctest: +ELLIPSIS
    SOLVE INFO (L-BFGS-B)
    ...
    >>> abs(result.parameters["viscosity"] / 0.05 - 1) < 0.01
    True
"""

from __future__ import annotations

import math as pymath
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tbmem import deferred_interrupt
from trainers.config import ConfigError, RunConfig
from trainers.data import ensure_simulations, load_simulation, make_step, phi_flow
from trainers.lbfgs import Iteration, IterationObserver
from trainers.monitoring import TrainerMonitoring
from trainers.phiml_profile import profiled

__all__ = ["PhysicalTrainer", "PhysicalResult", "COEFFICIENT_NAMES"]

#: Names a learnable coefficient may have, per PDE.
COEFFICIENT_NAMES = {"burgers": ("viscosity", "nu"), "heat": ("diffusivity", "nu")}
# The escape loss: far below any real loss, so the line search accepts the step at once.
_ESCAPE_LOSS = -1e30


@dataclass
class PhysicalResult:
    """What the optimisation found and how it ended (SciPy's SolveInfo)."""

    parameters: dict[str, float] = field(default_factory=dict)
    true_parameters: dict[str, float] = field(default_factory=dict)
    iterations: int = 0
    function_evaluations: int = 0
    converged: bool = False
    final_loss: float = float("nan")
    message: str = ""
    evaluations_seen: int = 0
    iterations_seen: int = 0

    def relative_errors(self) -> dict[str, float]:
        """|recovered / true - 1| for each coefficient with a known true value."""
        return {k: abs(v / self.true_parameters[k] - 1) for k, v in self.parameters.items()
                if k in self.true_parameters}


def _scalar(value: Any) -> float:
    # Detached first: float() of a tensor that requires grad warns, and warnings are errors in tests.
    native = value.native() if hasattr(value, "native") else value
    if hasattr(native, "detach"):
        native = native.detach()
    return float(native)


def _numpy(value: Any) -> np.ndarray:
    # SolveInfo fields are PhiML tensors (one entry per batch item) or plain numbers.
    return np.asarray(value.numpy() if hasattr(value, "numpy") else value)


class PhysicalTrainer:
    """Fits the learnable parameters of ``trainer_params.learnable_parameters`` with ``math.minimize``.

    Args:
        cfg: The validated run config (``trainer_type: physical``).
        monitoring: The run's writer and monitors.

    Raises:
        ConfigError: an unknown learnable parameter, or simulation indices out of range.
    """

    def __init__(self, cfg: RunConfig, *, monitoring: TrainerMonitoring) -> None:
        self.cfg, self.params, self.mon = cfg, cfg.trainer_params, monitoring
        pde = cfg.data.pde
        self.coefficient: tuple[str, float] | None = None
        self.learn_initial_state: float | None = None
        for p in self.params.learnable_parameters:
            name, guess = p["name"], p.get("initial_guess")
            if name in COEFFICIENT_NAMES[pde]:
                if guess is None or guess <= 0:
                    raise ConfigError(f"config key 'trainer_params.learnable_parameters' {name}: "
                                      f"initial_guess must be > 0, got {guess!r}")
                self.coefficient = (name, float(guess))
            elif name == "initial_state":
                self.learn_initial_state = float(guess or 0.0)
            else:
                raise ConfigError(f"config key 'trainer_params.learnable_parameters' has unknown name "
                                  f"{name!r}; {pde} learns {COEFFICIENT_NAMES[pde]} or 'initial_state'")
        if self.coefficient is None and self.learn_initial_state is None:
            raise ConfigError("config key 'trainer_params.learnable_parameters' is empty")
        bad = [i for i in self.params.train_sim if i >= cfg.data.num_sims]
        if bad:
            raise ConfigError(f"config key 'trainer_params.train_sim' names simulations {bad} but "
                              f"data.num_sims is {cfg.data.num_sims}")
        if self.params.num_predict_steps >= cfg.data.num_frames:
            raise ConfigError(f"config key 'trainer_params.num_predict_steps' must be < data.num_frames "
                              f"({cfg.data.num_frames})")
        self.evaluations = 0
        self.losses: list[float] = []  # each evaluation's loss, by index (the step of Loss/evaluation)
        self.iterations: list[Iteration] = []  # each L-BFGS-B iteration, as SciPy's callback reported it
        self.solves = 0  # SciPy minimisations PhiML ran (one per batch item of x0)
        self.abort: BaseException | None = None  # what ended minimize early (see the module docstring)

    # --- data -------------------------------------------------------------------------------
    def _ground_truth(self) -> list[Any]:
        import torch

        flow = phi_flow()
        from trainers.data import initial_state  # same grid geometry as the generator

        data, steps = self.cfg.data, self.params.num_predict_steps
        folder = ensure_simulations(data)
        arr = np.stack([load_simulation(folder, i)[:steps + 1] for i in self.params.train_sim], axis=1)
        template = initial_state(data, len(self.params.train_sim))
        space = "x" if data.dim == 1 else "x,y"
        frames = []
        for f in range(steps + 1):
            values = torch.from_numpy(np.ascontiguousarray(arr[f]))
            if data.pde == "burgers":
                t = flow.math.tensor(values, flow.batch("b"), flow.channel(vector=space), flow.spatial(space))
            else:
                t = flow.math.tensor(values[:, 0], flow.batch("b"), flow.spatial(space))
            frames.append(template.with_values(t))
        return frames

    # --- optimisation -----------------------------------------------------------------------
    def _x0(self, gt: list[Any]) -> tuple[Any, ...]:
        flow = phi_flow()
        x0: list[Any] = []
        if self.coefficient is not None:
            x0.append(flow.math.tensor(pymath.log(self.coefficient[1])))
        if self.learn_initial_state is not None:
            x0.append(flow.math.zeros(gt[0].values.shape) + self.learn_initial_state)
        return tuple(x0)

    def _unpack(self, xs: tuple[Any, ...]) -> tuple[Any, Any]:
        flow = phi_flow()
        i = 0
        nu: Any = self.cfg.data.nu  # a fixed, known coefficient when only the state is learned
        if self.coefficient is not None:
            nu, i = flow.math.exp(xs[0]), 1
        state = xs[i] if self.learn_initial_state is not None else None
        return nu, state

    def _objective(self, gt: list[Any], step: Any, *xs: Any) -> tuple[Any, Any]:
        flow = phi_flow()
        nu, state = self._unpack(xs)
        u = gt[0] if state is None else gt[0].with_values(state)
        total = 0
        for k in range(1, len(gt)):
            u = step(u, nu)
            total = total + flow.math.l2_loss(u - gt[k])
        return flow.math.sum(total, "b") / (len(gt) - 1), nu

    def _escape(self, xs: tuple[Any, ...]) -> Any:
        """A loss that ends L-BFGS-B: constant and flat (zero gradient), computed from ``xs`` alone."""
        flow = phi_flow()
        total: Any = 0
        for x in xs:
            total = total + flow.math.sum(x * 0, x.shape)  # keeps the graph from x: the gradient is 0
        return total + _ESCAPE_LOSS

    def _report(self, loss: Any, nu: Any) -> None:
        """Hand one evaluation to the monitors. Runs inside the loss: must never raise."""
        index = self.evaluations
        self.evaluations += 1
        try:
            params = {self.coefficient[0]: _scalar(nu)} if self.coefficient is not None else {}
            value = _scalar(loss)
        except Exception:  # noqa: BLE001 - a raise here would hang SciPy's worker
            self.losses.append(float("nan"))
            return
        self.losses.append(value)
        self.mon.on_evaluation(index, value, params)

    def train(self) -> PhysicalResult:
        """Run the optimisation; print and log the SolveInfo; return the result."""
        flow = phi_flow()
        mon, p = self.mon, self.params
        with mon.track("load_ground_truth"):
            gt = self._ground_truth()
        mon.print_memory("After loading ground truth data: ")
        step = make_step(self.cfg.data)
        x0 = self._x0(gt)
        self._objective(gt, step, *x0)  # outside minimize an error raises instead of hanging SciPy
        self.abort = None

        solve = flow.Solve(p.method, 0, p.abs_tol, x0=x0, max_iterations=p.max_iterations,
                           suppress=(flow.math.NotConverged,))
        mon.optimization_start()
        with mon.track("optimization"), deferred_interrupt() as interrupted:

            def loss_function(*xs: Any) -> Any:
                # Runs on the main thread while SciPy's worker waits on a barrier: nothing may raise.
                if self.abort is None and interrupted.is_set():
                    self.abort = KeyboardInterrupt()
                if self.abort is not None:
                    return self._escape(xs)
                try:  # inside a profile window (tbmem.profile): PhiML's backend calls in its trace
                    loss, nu = profiled(mon.writer, lambda: self._objective(gt, step, *xs))
                except BaseException as exc:  # noqa: BLE001 - kept and raised once SciPy has finished
                    self.abort = exc
                    return self._escape(xs)
                self._report(loss, nu)
                return loss

            # each SciPy iteration, live: chained to PhiML's own callback (trainers.lbfgs). With a batch
            # dimension in x0 PhiML runs one SciPy minimisation per batch item: the first one is followed.
            observer = IterationObserver(lambda it: mon.on_iteration(it) if it.solve == 0 else None)
            with flow.math.SolveTape() as tape, observer:
                solution = flow.math.minimize(loss_function, solve)
            self.iterations = [it for it in observer.iterations if it.solve == 0]
            self.solves = len(observer.results)
        if self.abort is not None:
            abort, self.abort = self.abort, None
            raise abort
        mon.print_memory("After optimization: ")
        mon.optimization_end()  # after it, as in design document 000: "After optimization", then the peak
        info = tape[solve]
        solution = solution if isinstance(solution, tuple) else (solution,)
        final_loss, nu = self._objective(gt, step, *solution)
        self._print_solution(_scalar(final_loss))
        msg = info.msg
        result = PhysicalResult(
            iterations=int(np.max(_numpy(info.iterations))),
            function_evaluations=int(np.max(_numpy(info.function_evaluations))),
            converged=bool(np.all(_numpy(info.converged))), final_loss=_scalar(final_loss),
            message="; ".join(map(str, msg)) if isinstance(msg, (list, tuple)) else str(msg),
            evaluations_seen=self.evaluations, iterations_seen=len(self.iterations))
        if self.coefficient is not None:
            result.parameters[self.coefficient[0]] = _scalar(nu)
            result.true_parameters[self.coefficient[0]] = self.cfg.data.nu
        self._publish(result)
        mon.print_summary()
        return result

    def _solution_iteration(self, final: float) -> int | None:
        """The iteration whose loss is the solution's (the last such), if one is."""
        return next((it.number for it in reversed(self.iterations) if it.loss == final), None)

    def _print_solution(self, final: float) -> None:
        """After the iterations printed during the run, the one at the solution when it was not among
        them: the final loss of SOLVE INFO is then the last loss printed."""
        shown = self.mon.iterations_printed()
        at = self._solution_iteration(final)
        if shown <= 0 or at is None or at <= shown:
            return
        if at > shown + 1:
            print(f"  ... iterations {shown + 1}-{at - 1}: in TensorBoard (Loss/iteration)", flush=True)
        it = self.iterations[at - 1]
        self.mon.print_iteration(at, final, evaluations=it.evaluations, note=" (the solution)")

    def _publish(self, result: PhysicalResult) -> None:
        at = self._solution_iteration(result.final_loss)
        where = f"iteration {at}" if at is not None else "at the solution"
        n, k = result.evaluations_seen, result.iterations_seen
        lines = ["SOLVE INFO (L-BFGS-B)",
                 f"  iterations: {result.iterations} (Iteration 1-{k}, the steps of Loss/iteration and LBFGS/*)",
                 f"  loss evaluations: {n} (each iteration evaluates the loss once or more; the steps 0-{n - 1} "
                 "of Loss/evaluation)",
                 f"  converged: {result.converged} ({result.message})",
                 *([f"  SciPy minimisations: {self.solves} (one per batch item of x0; iterations and "
                    "LBFGS/* follow the first)"] if self.solves > 1 else []),
                 f"  final loss: {result.final_loss:.6g} ({where})"]
        errors = result.relative_errors()
        for name, value in result.parameters.items():
            lines.append(f"  {name}: {value:.6g} (true {result.true_parameters[name]:.6g}, "
                         f"relative error {100 * errors[name]:.3f}%)")
        print("\n".join(lines), flush=True)
        self.mon.writer.add_text("Physical/solve_info", "\n".join(f"    {line}" for line in lines),
                                 max(n - 1, 0))
        self.mon.writer.flush()
