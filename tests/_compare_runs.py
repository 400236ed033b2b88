"""The acceptance example of ``tbmem compare``: the heat and Burgers physical models and the SyntheticTrainer
at two model widths, each a real (short) run of the trainers with monitoring, written by ``run.py``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["COMPARE_RUNS", "write_compare_runs"]

_ROOT = Path(__file__).resolve().parents[1]
#: run name -> run.py arguments (short versions of the configs: 2 shared cores)
COMPARE_RUNS = {
    "heat": ["--config-name=heat_physical_experiment", "trainer=physical_with_memory", "data.resolution=24",
             "data.num_frames=6", "data.num_sims=2", "trainer_params.train_sim=[0,1]",
             "trainer_params.num_predict_steps=5"],
    "burgers": ["--config-name=burgers_physical_quick_test", "trainer=physical_with_memory"],
    "unet_f8": ["--config-name=burgers_quick_test", "trainer=synthetic_with_memory", "trainer_params.epochs=1",
                "model.filters=8"],
    "unet_f16": ["--config-name=burgers_quick_test", "trainer=synthetic_with_memory", "trainer_params.epochs=1",
                 "model.filters=16"],
}


def write_compare_runs(cwd: Path) -> Path:
    """Run the four trainings in ``cwd`` (``runs/compare/<name>``, data in ``.cache``); return ``runs/compare``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(_ROOT), os.environ.get("PYTHONPATH")]))}
    for name, args in COMPARE_RUNS.items():
        cmd = [sys.executable, str(_ROOT / "run.py"), *args, "experiment=compare", f"run_name={name}",
               "trainer_params.progress=false", "data.progress=false"]
        done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
        if done.returncode:
            raise RuntimeError(f"{' '.join(cmd[1:])} failed ({done.returncode}):\n{done.stdout[-3000:]}\n"
                               f"{done.stderr[-3000:]}")
    return cwd / "runs" / "compare"
