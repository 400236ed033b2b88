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


# --- the command line before Hydra: misspelt keys, folders of failed starts, no torch for a config error ---

from trainers.overrides import check_overrides, config_groups, config_names  # noqa: E402

GROUPS = config_groups(ROOT / "conf")


def _run_py(tmp_path, *args: str, importtime: bool = False) -> subprocess.CompletedProcess:
    flags = ["-X", "importtime"] if importtime else []
    return subprocess.run([sys.executable, *flags, "run.py", "--config-name=burgers_quick_test",
                           f"runs_dir={tmp_path / 'runs'}", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_misspelt_key_gets_the_closest_name_not_hydras_advice(tmp_path):
    proc = _run_py(tmp_path, "trainer_params.lerning_rate=0.1")  # no "+": the way users type it
    assert proc.returncode == 2
    assert proc.stderr == ("config error: unknown config key 'trainer_params.lerning_rate' "
                           "(did you mean 'learning_rate'?)\n")  # not "To append to your config use +..."
    assert not (tmp_path / "runs").exists()  # stopped before Hydra made a folder


def test_a_key_in_the_wrong_section_is_pointed_to():
    with pytest.raises(ConfigError, match=r"'epochs' \(did you mean 'trainer_params.epochs'\?\)"):
        check_overrides(["epochs=3"], groups=GROUPS)
    with pytest.raises(ConfigError, match=r"'tbmem.snapshot.evry' \(did you mean 'every'\?\)"):
        check_overrides(["tbmem.snapshot.evry=3"], groups=GROUPS)


def test_every_schema_key_can_be_set_without_a_plus(compose):
    # tbmem.top_k and data.pin_memory are in no YAML file: plain Hydra would refuse them
    args = check_overrides(["tbmem.top_k=3", "data.pin_memory=true", "trainer=synthetic_with_memory",
                            "+trainer_params.epochs=2", "hydra.job.chdir=false"], groups=GROUPS)
    assert args == ["++tbmem.top_k=3", "++data.pin_memory=true", "trainer=synthetic_with_memory",
                    "+trainer_params.epochs=2", "hydra.job.chdir=false"]
    run = validate(compose("burgers_quick_test", *args[:3]))
    assert run.tbmem.top_k == 3 and run.data.pin_memory is True and run.trainer_params.enable_memory_monitoring


def test_a_failed_start_leaves_no_run_folder_and_imports_no_torch(tmp_path):
    proc = _run_py(tmp_path, "trainer_params.epochs=-1", importtime=True)
    assert proc.returncode == 2
    assert "config error: config key 'trainer_params.epochs' must be > 0, got -1" in proc.stderr
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "hydra" in imported and "torch" not in imported  # validated before torch's import (seconds)
    assert not (tmp_path / "runs" / "burgers_quick_test").exists()  # Hydra's .hydra/ and run.log removed


def test_simulation_indices_are_checked_at_validation():
    with pytest.raises(ConfigError, match=r"trainer_params.val_sim' names simulations \[9\] but data.num_sims is 4"):
        validate({"experiment": "x", "data": {"num_sims": 4}, "trainer_params": {"train_sim": [0], "val_sim": [9]}})


def test_an_earlier_run_keeps_its_experiment_folder(tmp_path):
    earlier = tmp_path / "runs" / "burgers_quick_test" / "earlier"
    earlier.mkdir(parents=True)
    (earlier / "events.out.tfevents.1").write_bytes(b"x")
    proc = _run_py(tmp_path, "trainer_params.epochs=0")
    assert proc.returncode == 2
    assert [p.name for p in (tmp_path / "runs" / "burgers_quick_test").iterdir()] == ["earlier"]


def test_a_misspelt_group_choice_or_config_name_gets_the_closest_name(tmp_path):
    """Hydra's own answers ("Could not find 'trainer/synthetic_with_memroy'", exit 1) become the key
    typos' treatment: one line naming the closest choice, exit 2, no run folder."""
    proc = _run_py(tmp_path, "trainer=synthetic_with_memroy")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == "config error: unknown trainer 'synthetic_with_memroy' (did you mean 'synthetic_with_memory'?)\n"
    proc = subprocess.run([sys.executable, "run.py", "--config-name", "burgers_quik_test", f"runs_dir={tmp_path / 'runs'}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == "config error: unknown config name 'burgers_quik_test' (did you mean 'burgers_quick_test'?)\n"
    assert not (tmp_path / "runs").exists()
    names = ", ".join(sorted(p.stem for p in (ROOT / "conf" / "model").glob("*.yaml")))
    with pytest.raises(ConfigError, match=rf"^unknown model 'resnet'; model is one of: {names}$"):
        check_overrides(["model=resnet"], groups=GROUPS)
    assert check_overrides(["--config-name=heat_physical_experiment.yaml", "data=heat_2d"], groups=GROUPS,
                           configs=config_names(ROOT / "conf")) == ["--config-name=heat_physical_experiment.yaml",
                                                                    "data=heat_2d"]
