"""Every config in conf/ validates; unknown or invalid keys stop the run naming the key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trainers.config import ConfigError, validate

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ["burgers_experiment", "burgers_quick_test", "burgers_physical_experiment",
           "heat_physical_experiment", "burgers_physical_quick_test"]


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("trainer", [None, "with_memory"])
def test_every_config_validates(compose, name, trainer):
    kind = "physical" if "physical" in name else "synthetic"
    overrides = [f"trainer={kind}_with_memory"] if trainer else []
    run = validate(compose(name, *overrides))
    assert run.experiment == name
    assert run.trainer_type == kind
    assert run.trainer_params.enable_memory_monitoring is bool(trainer)


def test_memory_flag_override(compose):
    run = validate(compose("burgers_experiment", "trainer_params.enable_memory_monitoring=true"))
    assert run.trainer_params.enable_memory_monitoring is True
    assert run.data.dim == 2 and run.data.pde == "burgers"


@pytest.mark.parametrize("override, key", [
    ("+trainer_params.lerning_rate=0.1", "trainer_params.lerning_rate"),
    ("+data.resolutoin=32", "data.resolutoin"),
    ("+model.filter=4", "model.filter"),
    ("+devices=cpu", "devices"),
])
def test_unknown_key_is_named(compose, override, key):
    with pytest.raises(ConfigError, match=rf"unknown config key '{key}'"):
        validate(compose("burgers_quick_test", override))


def test_suggests_the_closest_key(compose):
    with pytest.raises(ConfigError, match="did you mean 'learning_rate'"):
        validate(compose("burgers_quick_test", "+trainer_params.lerning_rate=0.1"))


@pytest.mark.parametrize("override, key", [
    ("trainer_params.optimizer=adamm", "trainer_params.optimizer"),
    ("trainer_params.batch_size=0", "trainer_params.batch_size"),
    ("trainer_params.use_amp=3", "trainer_params.use_amp"),
    ("data.pde=wave", "data.pde"),
    ("device=tpu", "device"),
])
def test_invalid_value_is_named(compose, override, key):
    with pytest.raises(ConfigError, match=rf"'{key}'"):
        validate(compose("burgers_quick_test", override))


def test_tbmem_keys_go_through_memory_writer_config(compose):
    run = validate(compose("burgers_quick_test", "tbmem.every=5", "tbmem.census_every=50"))
    assert (run.tbmem.every, run.tbmem.census_every) == (5, 50)
    with pytest.raises(ConfigError, match="evrey"):
        validate(compose("burgers_quick_test", "+tbmem.evrey=5"))


def test_learnable_parameter_entries_are_checked():
    with pytest.raises(ConfigError, match=r"learnable_parameters\[0\]"):
        validate({"experiment": "x", "trainer_params": {"learnable_parameters": [{"nmae": "nu"}]}})


def test_run_py_stops_at_start_naming_the_key(tmp_path):
    proc = subprocess.run(
        [sys.executable, "run.py", "--config-name=burgers_quick_test", f"runs_dir={tmp_path}",
         "+trainer_params.lerning_rate=0.1"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "trainer_params.lerning_rate" in proc.stderr
    assert not (tmp_path / "burgers_quick_test").exists() or not any(
        (tmp_path / "burgers_quick_test").rglob("events.out.tfevents*"))
