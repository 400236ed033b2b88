"""batch_size=auto: the SyntheticTrainer picks its batch from the forecast, says why, leaves no trace on
training; and the config keys that drive it are checked."""

from __future__ import annotations

import json
import re

import pytest
import torch

from tests._events import texts
from trainers.autobatch import choose_batch_size, forecast_trainer
from trainers.config import ConfigError, validate
from trainers.experiment import run_experiment
from trainers.monitoring import TrainerMonitoring
from trainers.synthetic import SyntheticTrainer

SMALL = ("trainer_params.epochs=2", "data.num_sims=3", "trainer_params.train_sim=[0,1]",
         "trainer_params.val_sim=[2]", "data.num_frames=20")


def _trainer(compose, tmp_path, *overrides):
    cfg = validate(compose("burgers_quick_test", *SMALL, "trainer_params.batch_size=8", *overrides))
    mon = TrainerMonitoring.create(tmp_path / "run", enabled=False, verbose_batches=0, tbmem_config=cfg.tbmem)
    return SyntheticTrainer(cfg, monitoring=mon), mon


def test_auto_chooses_says_why_and_trains_as_the_fixed_size_would(compose, tmp_path, capsys):
    auto = run_experiment(compose("burgers_quick_test", *SMALL, "trainer_params.batch_size=auto",
                                  "trainer_params.auto_batch_max=12"), log_dir=tmp_path / "auto")
    printed = capsys.readouterr().out
    line = next(l for l in printed.splitlines() if l.startswith("batch_size=auto:"))
    assert line.startswith("batch_size=auto: 12 (capped by trainer_params.auto_batch_max; memory allows up to ")
    assert "fitted on 4/8/16" in line and "held-out error" in line
    (entry,) = texts(auto.log_dir, "Memory/Forecast")
    assert entry[0] == 0 and line in entry[1]
    doc = json.loads(re.search(r"```json\n(.*?)\n```", entry[1], re.S).group(1))
    assert doc["in_use"] == 12 and doc["batch_sizes"] == [4, 8, 16] and doc["good"]

    fixed = run_experiment(compose("burgers_quick_test", *SMALL, "trainer_params.batch_size=12"),
                           log_dir=tmp_path / "fixed")
    # the forecast's probe steps were undone: the same losses as a run configured with 12
    assert auto.result.train_losses == pytest.approx(fixed.result.train_losses, rel=1e-6)
    assert auto.result.val_losses == pytest.approx(fixed.result.val_losses, rel=1e-6)


def test_memory_decides_when_the_budget_is_tight(compose, tmp_path):
    trainer, mon = _trainer(compose, tmp_path)
    forecast = forecast_trainer(trainer)
    budget = forecast.peak_bytes(10)
    choice = choose_batch_size(trainer, budget_bytes=budget, quiet=True)
    mon.close()
    assert (choice.batch_size, choice.limited_by) == (forecast.max_batch_size(budget), "memory")
    assert choice.batch_size == 10  # peak_bytes grows with every sample: 10 fits exactly, 11 does not


def test_nothing_fits_is_a_config_error(compose, tmp_path):
    trainer, mon = _trainer(compose, tmp_path, "trainer_params.auto_batch_budget_gb=0.000001")
    with pytest.raises(ConfigError, match="not even one sample fits: the forecast peak at batch size 1 is"):
        choose_batch_size(trainer, quiet=True)
    mon.close()


def test_forecast_leaves_model_optimizer_and_rng_as_they_were(compose, tmp_path):
    trainer, mon = _trainer(compose, tmp_path)
    weights = [p.detach().clone() for p in trainer.model.parameters()]
    rng = torch.get_rng_state()
    forecast_trainer(trainer)
    mon.close()
    for before, after in zip(weights, trainer.model.parameters()):
        assert torch.equal(before, after)
    assert not trainer.optimizer.state and all(p.grad is None for p in trainer.model.parameters())
    assert torch.equal(torch.get_rng_state(), rng)


@pytest.mark.parametrize("override, message", [
    ("trainer_params.batch_size=big", "must be an integer or 'auto'"),
    ("trainer_params.auto_batch_sizes=[8]", "two or more different batch sizes"),
    ("trainer_params.auto_batch_sizes=[0,4]", "two or more different batch sizes"),
    ("trainer_params.auto_batch_budget_gb=0", "auto_batch_budget_gb"),
    ("trainer_params.auto_batch_max=0", "auto_batch_max"),
])
def test_auto_batch_keys_are_checked(compose, override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate(compose("burgers_quick_test", override))


def test_auto_is_a_valid_batch_size(compose):
    run = validate(compose("burgers_quick_test", "trainer_params.batch_size=auto"))
    assert run.trainer_params.batch_size == "auto" and run.trainer_params.auto_batch_sizes == [4, 8, 16]
