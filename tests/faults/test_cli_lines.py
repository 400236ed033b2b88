"""Command lines that meet a missing input end with one clear line, not a library's message of several."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.faults._child import REPO, child_env


def test_forecast_with_a_missing_config_is_one_line(tmp_path):
    pytest.importorskip("hydra", reason="tbmem forecast reads Hydra configs (tbmem[trainers])")
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "small.yaml").write_text("a: 1\n")
    done = subprocess.run([sys.executable, "-m", "tbmem", "forecast", "--config-dir", str(tmp_path / "conf"),
                           "--config-name", "no_such_config"], check=False, capture_output=True, text=True,
                          timeout=120, env=child_env(), cwd=str(REPO))
    assert done.returncode != 0
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert "no_such_config" in lines[0] and "small" in lines[0]
