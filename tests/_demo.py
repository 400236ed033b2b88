"""The demo's logdir, written by the very commands of ``make demo`` (read from the Makefile), in a
folder of the test's: what a new user has after ``make demo`` (both trainers' runs), not a stand-in."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

__all__ = ["ROOT", "demo_commands", "write_demo_logdir"]

ROOT = Path(__file__).resolve().parents[1]


def demo_commands() -> list[list[str]]:
    """The ``run.py`` commands of the Makefile's ``demo`` target, with this interpreter."""
    text = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^demo:.*\n((?:\t.*\n)+)", text, re.M)
    assert recipe, "the Makefile has no demo target"
    out = []
    for line in recipe.group(1).splitlines():
        words = shlex.split(line.strip())
        if len(words) > 1 and words[0] == "$(BIN)/python" and words[1] == "run.py":
            out.append([sys.executable, str(ROOT / "run.py"), *words[2:]])
    assert len(out) == 2, f"expected the two trainers' commands in make demo, got {out}"
    return out


def write_demo_logdir(cwd: Path) -> Path:
    """Run ``make demo``'s trainings in ``cwd`` (their ``runs/`` and ``.cache/`` go there); return ``runs``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    for cmd in demo_commands():
        done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
        if done.returncode:
            raise RuntimeError(f"{' '.join(cmd[1:])} failed ({done.returncode}):\n{done.stdout[-3000:]}\n"
                               f"{done.stderr[-3000:]}")
    return cwd / "runs"
