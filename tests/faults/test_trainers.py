"""Both trainers through ``run.py`` (Hydra) in a child process: Ctrl-C, SIGTERM and an error in the loss.

The child slows each step down (a sleep in the loss or the rollout) so a real signal lands
in the middle of training; everything else is the real entry point. Every wait has a
time limit: a run that never ends (SciPy's worker blocked on its barrier) fails the test.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.faults._child import finish, run_child, start_child, steps_of, wait_for_line

pytestmark = pytest.mark.slow

_PHYSICAL = """
    import runpy, sys, time
    import trainers.physical as physical
    real = physical.PhysicalTrainer._objective
    calls = [0]
    mode, runs, cache = sys.argv[1:4]

    def objective(self, *xs):
        calls[0] += 1
        if calls[0] > 1:  # the first call is the check before minimize
            print("evaluation", calls[0] - 2, flush=True)
        if mode == "raise" and calls[0] == 5:
            raise RuntimeError("the physics exploded")
        time.sleep(0.15)
        return real(self, *xs)

    physical.PhysicalTrainer._objective = objective
    sys.argv = ["run.py", "--config-name=burgers_physical_quick_test", "trainer=physical_with_memory",
                f"runs_dir={runs}", f"data.cache_dir={cache}", "run_name=run", "data.progress=false",
                "trainer_params.abs_tol=1e-30", "trainer_params.max_iterations=1000"]
    runpy.run_path("run.py", run_name="__main__")
"""

_SYNTHETIC = """
    import runpy, sys, time
    import trainers.synthetic as synthetic
    real = synthetic.rollout_loss
    calls = [0]
    mode, runs, cache = sys.argv[1:4]

    def rollout_loss(model, x0, targets):
        if model.training:
            print("batch", calls[0], flush=True)
            calls[0] += 1
        time.sleep(0.05)
        return real(model, x0, targets)

    synthetic.rollout_loss = rollout_loss
    sys.argv = ["run.py", "--config-name=burgers_quick_test", "trainer=synthetic_with_memory",
                f"runs_dir={runs}", f"data.cache_dir={cache}", "run_name=run", "data.progress=false",
                "trainer_params.progress=false", "trainer_params.epochs=50", "tbmem.every=3"]
    runpy.run_path("run.py", run_name="__main__")
"""


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One simulation cache for the module: each run generates its data only once."""
    return tmp_path_factory.mktemp("cache")


def _start(script: str, mode: str, tmp_path: Path, cache: Path):
    return start_child(script, mode, str(tmp_path / "runs"), str(cache))


def _run_dir(tmp_path: Path, experiment: str) -> Path:
    return tmp_path / "runs" / experiment / "run"


def _stopped_line(err: str, prefix: str) -> tuple[list[str], int]:
    lines = [line for line in err.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, err
    return lines, int(lines[0].split("at step ")[1].split(";")[0])


def test_ctrl_c_during_lbfgsb_ends_with_one_line_and_status_130(tmp_path, cache):
    proc = _start(_PHYSICAL, "slow", tmp_path, cache)
    wait_for_line(proc, lambda line: line == "evaluation 4")
    proc.send_signal(signal.SIGINT)
    out, err = finish(proc)  # a blocked SciPy worker would hang here
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    run = _run_dir(tmp_path, "burgers_physical_quick_test")
    (line,), step = _stopped_line(err, "Interrupted (Ctrl-C)")
    assert line == f"Interrupted (Ctrl-C): the run stopped at step {step}; its records are flushed to {run}"
    assert step >= 4
    # every evaluation up to the interrupted one is on disk, loss and memory record alike
    assert steps_of(run, "Loss/evaluation") == list(range(step + 1))
    assert steps_of(run, "Memory/RAM/process_rss_GB") == list(range(step + 1))


def test_an_error_in_the_loss_after_its_first_evaluation_ends_the_run(tmp_path, cache):
    proc = _start(_PHYSICAL, "raise", tmp_path, cache)
    out, err = finish(proc, 120)
    assert proc.returncode == 1, err
    assert "Traceback" not in err
    run = _run_dir(tmp_path, "burgers_physical_quick_test")
    (line,), step = _stopped_line(err, "error: ")
    assert line == (f"error: RuntimeError: the physics exploded; the run stopped at step {step}; its records "
                    f"are flushed to {run} (traceback in {run / 'traceback.txt'})")
    assert "evaluation 3" in out and "evaluation 4" not in out
    assert step == 2  # evaluations 0 to 2 were logged, evaluation 3 raised
    assert steps_of(run, "Loss/evaluation") == [0, 1, 2]
    assert "in objective\nRuntimeError: the physics exploded" in (run / "traceback.txt").read_text()


def test_the_original_exception_object_leaves_physical_trainer_train(tmp_path, cache):
    proc = run_child("""
        import sys, tempfile
        import trainers.physical as physical
        from trainers.config import validate
        from trainers.monitoring import TrainerMonitoring
        real = physical.PhysicalTrainer._objective
        calls, raised = [0], RuntimeError("boom")

        def objective(self, *xs):
            calls[0] += 1
            if calls[0] == 3:
                raise raised
            return real(self, *xs)

        physical.PhysicalTrainer._objective = objective
        cfg = validate({"experiment": "t", "trainer_type": "physical",
            "data": {"resolution": 32, "num_frames": 5, "num_sims": 1, "cache_dir": sys.argv[1], "progress": False},
            "trainer_params": {"train_sim": [0], "abs_tol": 1e-30, "learnable_parameters": [
                {"name": "viscosity", "initial_guess": 0.02}, {"name": "initial_state"}]}})
        mon = TrainerMonitoring.create(tempfile.mkdtemp(), enabled=False, verbose_batches=0, tbmem_config=cfg.tbmem)
        trainer = physical.PhysicalTrainer(cfg, monitoring=mon)
        try:
            trainer.train()
        except RuntimeError as exc:
            print("same object:", exc is raised, "calls:", calls[0], "evaluations logged:", trainer.evaluations)
        mon.close()
    """, str(cache), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "same object: True calls: 3 evaluations logged: 1" in proc.stdout


def test_sigterm_during_lbfgsb_flushes_and_dies_by_sigterm(tmp_path, cache):
    proc = _start(_PHYSICAL, "slow", tmp_path, cache)
    lines = wait_for_line(proc, lambda line: line == "evaluation 3")
    proc.send_signal(signal.SIGTERM)
    out, err = finish(proc)
    assert proc.returncode == -signal.SIGTERM, err
    run = _run_dir(tmp_path, "burgers_physical_quick_test")
    # Hydra's logging puts its prefix before tbmem's line, on stdout and in run.log
    finals = [line.split("] - ")[-1] for line in out.splitlines() if "SIGTERM" in line]
    assert finals == [f"tbmem: SIGTERM: final record at step {steps_of(run, 'Loss/evaluation')[-1]} written, "
                      f"{run} closed"]
    evaluations = steps_of(run, "Loss/evaluation")  # the one in progress at the signal is not among them
    assert evaluations == list(range(len(evaluations))) and len(evaluations) >= 3
    assert steps_of(run, "Memory/RAM/process_rss_GB") == evaluations + evaluations[-1:]  # + the final record


def test_ctrl_c_in_synthetic_training_ends_with_one_line_and_status_130(tmp_path, cache):
    proc = _start(_SYNTHETIC, "slow", tmp_path, cache)
    wait_for_line(proc, lambda line: line == "batch 6")
    proc.send_signal(signal.SIGINT)
    out, err = finish(proc)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    run = _run_dir(tmp_path, "burgers_quick_test")
    (line,), step = _stopped_line(err, "Interrupted (Ctrl-C)")
    assert line == f"Interrupted (Ctrl-C): the run stopped at step {step}; its records are flushed to {run}"
    assert step >= 6
    every = 3  # tbmem.every in the child's overrides
    # the interrupted step's own record is written only if it got as far as its backward pass
    assert steps_of(run, "Memory/RAM/process_rss_GB") in (list(range(0, step, every)),
                                                          list(range(0, step + 1, every)))
