"""mypy and ruff over the project, with the settings of pyproject.toml: 0 findings (docs/architecture.md).

mypy keeps its cache per checkout under the system's temporary folder, so a second run checks only what
changed (a cold run took 2 to 20 minutes on the two shared cores of the development machine, a warm one
under a minute).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tool(module: str) -> list[str]:
    """The command that runs ``module`` from this interpreter's environment (the dev extra installs both)."""
    try:
        __import__(module)
    except ImportError:
        pytest.fail(f"{module} is not installed: pip install -c constraints.txt -e '.[dev]'")
    return [sys.executable, "-m", module]


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MYPYPATH", "RUFF_CACHE_DIR")}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600, check=False)


def test_mypy_finds_nothing() -> None:
    cache = Path(tempfile.gettempdir()) / f"tbmem-mypy-{hashlib.sha1(str(ROOT).encode()).hexdigest()[:12]}"
    done = _run(_tool("mypy") + ["--cache-dir", str(cache), "--no-error-summary", "--hide-error-context"])
    assert done.returncode == 0, f"mypy (pyproject.toml [tool.mypy]):\n{done.stdout}{done.stderr}"


def test_ruff_finds_nothing() -> None:
    targets = [p for p in ("tbmem", "trainers", "tests", "benchmarks", "scripts") if (ROOT / p).is_dir()]
    targets += sorted(p.name for p in ROOT.glob("*.py"))
    done = _run(_tool("ruff") + ["check", "--no-cache", "--output-format", "concise", *targets])
    assert done.returncode == 0, f"ruff (pyproject.toml [tool.ruff]):\n{done.stdout}{done.stderr}"


def test_the_checks_can_fail(tmp_path: Path) -> None:
    """Both tools, with this project's settings, report a typing error and an unused import."""
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n\n\ndef f(x: int) -> str:\n    return x\n")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    mypy = subprocess.run(_tool("mypy") + ["--no-incremental", "--config-file", str(tmp_path / "pyproject.toml"),
                                           str(bad)], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert mypy.returncode == 1 and "Incompatible return value type" in mypy.stdout, mypy.stdout + mypy.stderr
    ruff = subprocess.run(_tool("ruff") + ["check", "--no-cache", str(bad)], cwd=tmp_path, capture_output=True,
                          text=True, check=False)
    assert ruff.returncode == 1 and "F401" in ruff.stdout, ruff.stdout + ruff.stderr
