"""`tbmem forecast` on the trainers' configs, as a real subprocess: table, JSON, exit statuses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def forecast(tmp_path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    base = ["--config-dir", str(ROOT / "conf")]
    common = [f"data.cache_dir={tmp_path / 'cache'}", "data.progress=false", "trainer_params.progress=false",
              "data.num_sims=3", "data.num_frames=20", "trainer_params.train_sim=[0,1]", "trainer_params.val_sim=[2]"]
    cmd = [sys.executable, "-m", "tbmem", "forecast", *base, *args]
    if "burgers_quick_test" in args:
        cmd += common
    return subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)


def test_table_for_the_quick_config(tmp_path):
    proc = forecast(tmp_path, "--config-name", "burgers_quick_test", "--at", "512")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "Memory forecast on cpu, fitted on batch sizes 4, 8, 16" in out
    assert "n=512 (forecast)" in out and "available RAM" in out
    assert "configured batch_size=16: forecast peak" in out and "fits the budget" in out
    assert "batch_size=auto:" in out


def test_json_and_a_batch_that_does_not_fit(tmp_path):
    proc = forecast(tmp_path, "--config-name", "burgers_quick_test", "--json", "--budget-gb", "0.0005",
                    "--sizes", "2,4,8", "trainer_params.batch_size=64")
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["batch_sizes"] == [2, 4, 8] and doc["configured_batch_size"] == 64 and not doc["fits"]
    assert doc["budget_bytes"] == int(0.0005 * 2**30)
    assert doc["forecast"]["64"] > doc["budget_bytes"] >= doc["forecast"][str(doc["max_batch_size"])]
    assert doc["auto_batch_size"] == doc["max_batch_size"] and doc["auto_limited_by"] == "memory"


@pytest.mark.parametrize("args, message", [
    (("--config-name", "heat_physical_experiment"), "tbmem forecast applies to the synthetic trainer"),
    (("--config-name", "burgers_quick_test", "trainer_params.lerning_rate=1"), "lerning_rate"),
    (("--config-name", "burgers_quick_test", "--budget-gb", "-1"), "--budget-gb must be > 0"),
    (("--config-name", "no_such_config"), "no_such_config"),
    (("--config-name", "burgers_quick_test", "--sizes", "8,x"), "expected batch sizes like 16,32,64"),
])
def test_errors_are_one_line_and_exit_2(tmp_path, args, message):
    proc = forecast(tmp_path, *args)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert message in proc.stderr and "Traceback" not in proc.stderr
