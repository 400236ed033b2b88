"""PhysicalTrainer end to end: recovery within 1%, one TensorBoard step per loss evaluation, one per
L-BFGS-B iteration (as many as SciPy's own result counts).

Only losses that cannot raise are used: a raise inside math.minimize's loss hangs SciPy.
"""

from __future__ import annotations

import re

import pytest

from tests._events import read_events, scalars, texts
from trainers.experiment import run_experiment


@pytest.mark.e2e  # the fast tier's one end-to-end run of this trainer (tests/slow.txt)
def test_quick_test_recovers_viscosity_with_monitoring(compose, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TBMEM_DEMO", "1")  # as `make demo` runs it (tests/trainers/test_synthetic.py: without)
    cfg = compose("burgers_physical_quick_test", "trainer=physical_with_memory")
    out = run_experiment(cfg, log_dir=tmp_path / "run")
    result = out.result
    assert abs(result.parameters["viscosity"] / cfg.data.nu - 1) < 0.01  # the quality bar
    assert result.converged and result.function_evaluations >= result.iterations > 0

    evals = scalars(out.log_dir, "Loss/evaluation")
    assert [s for s, _ in evals] == list(range(result.evaluations_seen))
    assert result.evaluations_seen == result.function_evaluations
    nu = scalars(out.log_dir, "Physical/viscosity")
    assert nu[0][1] == pytest.approx(0.02, rel=1e-5)  # the initial guess is evaluated first
    assert nu[-1][1] == pytest.approx(result.parameters["viscosity"], rel=1e-3)
    assert min(v for _, v in evals) == pytest.approx(result.final_loss, rel=1e-2, abs=1e-9)
    rss = [e.step for e in read_events(out.log_dir).Scalars("Memory/RAM/process_rss_GB")]
    assert rss == list(range(result.evaluations_seen))  # tbmem.every = 1 in physical_with_memory
    (_, info), = texts(out.log_dir, "Physical/solve_info/text_summary")
    assert f"loss evaluations: {result.evaluations_seen}" in info

    printed = capsys.readouterr().out
    assert "After loading ground truth data:" in printed
    # make demo ends with one command for both runs: each trainer's own (three in all) is left out there
    assert re.search(r"^Done in \d+\.\d s\.$", printed, re.MULTILINE) and "--logdir" not in printed
    shown = min(cfg.trainer_params.memory_monitor_batches, result.iterations)
    assert printed.count("; memory: CPU") == shown  # the first iterations, each with its memory
    _design_document_evaluation_lines(printed, cfg.trainer_params.memory_monitor_batches, result, out.log_dir)
    _console_counts_one_way(printed, result)
    assert "PERFORMANCE SUMMARY" in printed and "load_ground_truth" in printed and "optimization" in printed
    assert "SOLVE INFO" in printed
    # design document 000's closing line; on CPU the peak is the process's RSS peak
    peak = re.search(r"^Peak CPU memory during optimization: (\d+\.\d) MB$", printed, re.MULTILINE)
    assert peak and float(peak.group(1)) > 0 and "Epoch end" not in printed


def _design_document_evaluation_lines(printed: str, first: int, result, log_dir) -> None:
    """Design document 000's ``Loss evaluation 0: CPU: 853.2 MB | GPU: 0.8 MB`` for the first
    ``memory_monitor_batches`` evaluations, each the RSS TensorBoard has at that evaluation's step, and
    the first printed before the first iteration (as the document's example shows them)."""
    lines = re.findall(r"^Loss evaluation (\d+): CPU: (\d+\.\d) MB \| GPU: (n/a|\d+\.\d MB)$", printed, re.MULTILINE)
    assert [int(i) for i, _, _ in lines] == list(range(min(first, result.evaluations_seen)))
    assert {gpu for _, _, gpu in lines} == {"n/a"}  # CPU only: no zero that was not read
    rss = {e.step: e.value * 1024 for e in read_events(log_dir).Scalars("Memory/RAM/process_rss_GB")}
    for i, cpu, _ in lines:  # read just before the evaluation's memory record
        assert float(cpu) == pytest.approx(rss[int(i)], abs=32)
    assert printed.index("Loss evaluation 0: CPU") < printed.index("  Iteration 1: loss=")


def _console_counts_one_way(printed: str, result) -> None:
    """The console prints L-BFGS-B iterations (design document 000's ``Iteration i: loss=...``), counted
    as SciPy and TensorBoard count them (from 1, the step of Loss/iteration), never evaluations; the final
    loss of SOLVE INFO is the last loss printed before it."""
    its = [(int(i), float(v)) for i, v in re.findall(r"^  Iteration (\d+): loss=(\S+?)[;\s]", printed + "\n", re.M)]
    numbers = [i for i, _ in its]
    assert numbers == sorted(set(numbers)) and numbers[0] == 1 and numbers[-1] == result.iterations
    assert "Evaluation" not in printed.split("SOLVE INFO")[0]
    assert re.search(rf"^  iterations: {result.iterations} \(Iteration 1-{result.iterations},", printed, re.M)
    assert re.search(rf"^  loss evaluations: {result.evaluations_seen} \(", printed, re.M)
    final = re.search(r"^  final loss: (\S+) \(iteration (\d+)\)$", printed, re.M)
    assert final and float(final.group(1)) == pytest.approx(result.final_loss, rel=1e-5)
    assert its[-1] == (int(final.group(2)), pytest.approx(float(final.group(1))))


def test_heat_diffusivity_and_iteration_limit(compose, tmp_path):
    # max_iterations=1 stops early: NotConverged is suppressed and the SolveInfo says so.
    cfg = compose("heat_physical_experiment", "data.resolution=16", "data.num_frames=4", "data.num_sims=2",
                  "trainer_params.train_sim=[0,1]", "trainer_params.num_predict_steps=3",
                  "trainer_params.max_iterations=1")
    out = run_experiment(cfg, log_dir=tmp_path / "run")
    assert out.result.converged is False
    assert out.result.iterations == 1
    assert "diffusivity" in out.result.parameters
    assert len(scalars(out.log_dir, "Physical/diffusivity")) == out.result.evaluations_seen


def test_monitoring_failure_inside_the_loss_is_reported_once(compose, tmp_path, tbmem_log, monkeypatch):
    from trainers.config import validate
    from trainers.monitoring import TrainerMonitoring
    from trainers.physical import PhysicalTrainer

    cfg = validate(compose("burgers_physical_quick_test", "trainer=physical_with_memory",
                           "trainer_params.memory_monitor_batches=0"))
    mon = TrainerMonitoring.create(tmp_path / "run", enabled=True, verbose_batches=0, tbmem_config=cfg.tbmem)
    calls = []

    def broken(step, **kwargs):
        calls.append(step)
        raise RuntimeError("probe exploded")

    monkeypatch.setattr(mon.writer, "log_memory", broken)
    result = PhysicalTrainer(cfg, monitoring=mon).train()
    mon.close()
    assert abs(result.parameters["viscosity"] / cfg.data.nu - 1) < 0.01
    assert calls == [0]  # switched off after the first failure
    messages = [r.getMessage() for r in tbmem_log.records if "loss evaluation failed" in r.getMessage()]
    assert len(messages) == 1 and "probe exploded" in messages[0]
    # the loss itself is still logged for every evaluation
    assert len(scalars(tmp_path / "run", "Loss/evaluation")) == result.evaluations_seen


@pytest.fixture
def scipy_results(monkeypatch):
    """Every OptimizeResult SciPy's minimize returns during the test: a spy installed under the trainer's
    own wrapper (trainers.lbfgs wraps whatever scipy.optimize.minimize is when the solve starts)."""
    import scipy.optimize

    real = scipy.optimize.minimize
    results = []

    def spy(*args, **kwargs):
        res = real(*args, **kwargs)
        results.append(res)
        return res

    monkeypatch.setattr(scipy.optimize, "minimize", spy)
    return results


@pytest.mark.parametrize("overrides", [
    ("burgers_physical_quick_test", "trainer=physical_with_memory", "trainer_params.memory_monitor_batches=2"),
    ("heat_physical_experiment", "trainer=physical_with_memory", "data.resolution=16", "data.num_frames=6",
     "data.num_sims=2", "trainer_params.train_sim=[0,1]", "trainer_params.num_predict_steps=5",
     "trainer_params.learnable_parameters=[{name: diffusivity, initial_guess: 0.2}]"),
], ids=["burgers", "heat"])
def test_iterations_are_scipys_own(compose, tmp_path, capsys, scipy_results, overrides):
    """One step of Loss/iteration and LBFGS/* per SciPy iteration (as many as its result's nit), the
    evaluations as many as its nfev; PhiML's own callback still counts them (chained, not replaced)."""
    import scipy.optimize

    cfg = compose(*overrides)
    out = run_experiment(cfg, log_dir=tmp_path / "run")
    assert scipy.optimize.minimize.__name__ == "spy"  # the trainer's wrapper is gone after the solve
    (res,) = scipy_results
    result = out.result
    assert res.nit >= 2 and res.nfev > res.nit  # a line search evaluated more than once somewhere
    assert result.iterations == res.nit  # PhiML's SolveInfo: its own callback ran at every iteration
    assert result.function_evaluations == res.nfev

    losses = scalars(out.log_dir, "Loss/iteration")
    assert [s for s, _ in losses] == list(range(1, res.nit + 1))
    evaluations = scalars(out.log_dir, "LBFGS/evaluations")
    assert [s for s, _ in evaluations] == list(range(1, res.nit + 1))
    counts = [int(v) for _, v in evaluations]
    assert counts == sorted(counts) and counts[-1] <= res.nfev
    assert len(scalars(out.log_dir, "Loss/evaluation")) == res.nfev
    # the loss of an iteration is that of the evaluation at its iterate: the line search's last one
    per_eval = dict(scalars(out.log_dir, "Loss/evaluation"))
    for (_, loss), n in zip(losses, counts):
        assert loss == pytest.approx(per_eval[n - 1], rel=1e-6)
    assert losses[-1][1] == pytest.approx(float(res.fun), rel=1e-6)
    norms = scalars(out.log_dir, "LBFGS/grad_norm")
    assert len(norms) == res.nit and all(v >= 0 for _, v in norms)
    assert norms[-1][1] == pytest.approx(float((res.jac ** 2).sum() ** 0.5), rel=1e-5)
    for tag in ("LBFGS/iteration_time_ms", "LBFGS/process_rss_GB"):
        values = scalars(out.log_dir, tag)
        assert [s for s, _ in values] == list(range(1, res.nit + 1)) and all(v > 0 for _, v in values), tag
    printed = capsys.readouterr().out
    _console_counts_one_way(printed, result)
