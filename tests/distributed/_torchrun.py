"""Run a script under ``torchrun --standalone`` in a real subprocess, bounded by a timeout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["ROOT", "JOB", "torchrun"]

ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).with_name("_job.py")


def torchrun(nproc: int, script: str | Path, *args: str, timeout: float = 300,
             cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m torch.distributed.run --standalone --nproc_per_node=N script args`` (gloo, CPU).

    The machine has two busy cores: ``OMP_NUM_THREADS=1`` and a generous timeout; a job that
    outlives it is killed and the test fails with its output instead of hanging the suite.
    """
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    env.pop("PYTHONWARNINGS", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           str(script), *args]
    try:
        return subprocess.run(cmd, env=env, cwd=cwd or ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = (exc.stderr or b"").decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        raise AssertionError(f"torchrun did not finish within {timeout} s (a hang):\n{out[-3000:]}\n"
                             f"{err[-6000:]}") from None
