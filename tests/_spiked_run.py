"""A real SyntheticTrainer run (the demo's ``burgers_quick_test`` with monitoring, 3 epochs) whose training
loss is multiplied by :data:`SPIKE_FACTOR` at step :data:`SPIKE_STEP`: the loss the trainer logs there, and
the gradient it steps with, are that much larger. Shared by the trainer's and the Memory tab's spike tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["SPIKE_STEP", "SPIKE_FACTOR", "write_spiked_run", "write_spiked_logdir"]

SPIKE_STEP = 40
SPIKE_FACTOR = 50.0


def write_spiked_run(root: Path, *, spike: bool = True, name: str = "spiked") -> Any:
    """Train into ``root/runs/<name>`` (data cached in ``root/cache``); returns the trainer's Outcome.
    ``spike=False``: the same run without the injection."""
    import trainers.synthetic as synthetic
    from tests._hydra import composer
    from trainers.experiment import run_experiment

    cfg = composer(root)("burgers_quick_test", "trainer=synthetic_with_memory", "trainer_params.epochs=3",
                         "tbmem.every=1", "tbmem.census_every=10", "trainer_params.memory_monitor_batches=0")
    real = synthetic.rollout_loss
    calls = [0]

    def spiked(model, x0, targets):
        loss = real(model, x0, targets)
        if model.training:
            if spike and calls[0] == SPIKE_STEP:
                loss = loss * SPIKE_FACTOR
            calls[0] += 1
        return loss

    synthetic.rollout_loss = spiked
    try:
        return run_experiment(cfg, log_dir=root / "runs" / name)
    finally:
        synthetic.rollout_loss = real


def write_spiked_logdir(root: Path) -> Path:
    """``root/runs/spiked`` and ``root/runs/clean`` (the same run without the spike), trained in a child
    process: a training in the test process would leave its tensors to the censuses of later tests."""
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))}
    code = ("import sys; from pathlib import Path; from tests._spiked_run import write_spiked_run; "
            "root = Path(sys.argv[1]); write_spiked_run(root, spike=True, name='spiked'); "
            "write_spiked_run(root, spike=False, name='clean')")
    done = subprocess.run([sys.executable, "-c", code, str(root)], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=600)
    if done.returncode:
        raise RuntimeError(f"the spiked runs failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return root / "runs"
