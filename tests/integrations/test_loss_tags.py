"""The frameworks' loss tags (train/loss, train_loss, loss), a run's own ``loss_tags`` (recorded in the run) and
TBMEM_LOSS_TAGS are losses for the tab, the spike detector and tbmem report; ``module_depth`` is configuration too."""

from __future__ import annotations

import fnmatch
import json

import pytest
import torch
from torch.utils.tensorboard import SummaryWriter

from tbmem import MemoryWriter, MemoryWriterConfig
from tbmem.analysis import load_scalars, summarize
from tbmem._internal.analysis.spikes import find_spikes
from tbmem._internal.cli import main
from tbmem._internal.logdir.settings import SETTINGS_LOG, RunSettings, read_settings
from tbmem._internal.logdir.spikes import read_spikes
from tbmem._internal.plugin.charts import is_step_loss
from tbmem._internal.spikes import SpikeConfig
from tbmem._internal.tags import is_loss_tag
from tests.integrations._counts import censuses


@pytest.mark.parametrize("tag", ["train/loss", "train_loss", "loss", "Loss/batch"])
def test_each_frameworks_loss_is_a_step_loss(tag):
    assert is_loss_tag(tag) and is_step_loss(tag)
    assert any(fnmatch.fnmatchcase(tag, p) for p in SpikeConfig().tags)


def test_loss_tags_from_the_environment(monkeypatch):
    assert not is_step_loss("train/ce_loss") and not is_loss_tag("train/grad_norm")
    monkeypatch.setenv("TBMEM_LOSS_TAGS", "train/ce_*, val/x")
    assert is_step_loss("train/ce_loss") and is_loss_tag("val/x")


@pytest.mark.parametrize("tag", ["train/loss", "train_loss"])
def test_report_finds_a_spike_of_a_frameworks_loss(tmp_path, tag):
    with SummaryWriter(str(tmp_path / "run")) as w:  # the framework's own writer: no tbmem in the run
        for step in range(30):
            w.add_scalar(tag, 9.0 if step == 20 else 1.0, step)
            w.add_scalar("Memory/RAM/process_rss_GB", 1.0, step)
    (spike,) = find_spikes(load_scalars(str(tmp_path)), str(tmp_path))
    assert (spike.tag, spike.step) == (tag, 20)


# --- loss_tags and module_depth are configuration, recorded in the run -----------------------------------------
def _write(run, *, tag="train/ce_loss", spike_at=20, steps=30, **options):
    """A MemoryWriter run whose loss is ``tag`` (a spike at ``spike_at``), memory at every step."""
    with MemoryWriter(run, every=1, census_every=0, custom_layout=False, **options) as w:
        for step in range(steps):
            w.add_scalar(tag, 9.0 if step == spike_at else 1.0 + 0.01 * (step % 3), step)
            w.log_memory(step)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("loss_tags", "train/ce_loss", "must be a list of tag patterns"),
    ("loss_tags", ["train/ce_loss", ""], "non-empty tag patterns"),
    ("loss_tags", [3], "non-empty tag patterns"),
    ("module_depth", 0, "module_depth must be a number of levels >= 1"),
    ("module_depth", "2", "module_depth must be a number of levels >= 1"),
])
def test_loss_tags_and_module_depth_are_checked_configuration(field, value, message):
    with pytest.raises(ValueError, match=message):
        MemoryWriterConfig(**{field: value})
    with pytest.raises(ValueError, match=message):
        MemoryWriterConfig.from_mapping({field: value})  # a Hydra node
    cfg = MemoryWriterConfig(loss_tags=["train/ce_*"], module_depth=2, spikes=True)
    assert cfg.loss_tags == ("train/ce_*",) and cfg.module_depth == 2 and "train/ce_*" in cfg.spikes.tags


def test_a_runs_own_loss_tags_reach_tbmem_report_in_its_own_process(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("TBMEM_LOSS_TAGS", raising=False)
    _write(tmp_path / "own", loss_tags=["train/ce_*"])
    _write(tmp_path / "other")  # the same tag, not configured as a loss: not one
    assert read_settings(str(tmp_path / "own")) == RunSettings(loss_tags=("train/ce_*",), module_depth=1)
    assert not (tmp_path / "other" / SETTINGS_LOG).exists()  # the defaults: nothing written
    summaries = {s.run: s for s in summarize(str(tmp_path))}
    assert set(summaries["own"].last_loss) == {"train/ce_loss"} and summaries["other"].last_loss == {}
    (spike,) = find_spikes(load_scalars(str(tmp_path)), str(tmp_path))
    assert (spike.run, spike.tag, spike.step, spike.source) == ("own", "train/ce_loss", 20, "report")
    assert main(["report", str(tmp_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {r["run"]: list(r["last_loss"]) for r in doc["runs"]} == {"own": ["train/ce_loss"], "other": []}
    assert [(s["run"], s["tag"], s["step"]) for s in doc["spikes"]] == [("own", "train/ce_loss", 20)]


def test_the_spike_detector_of_the_run_watches_its_loss_tags(tmp_path, monkeypatch):
    monkeypatch.delenv("TBMEM_LOSS_TAGS", raising=False)
    _write(tmp_path / "run", loss_tags=["train/ce_*"], spikes=True)
    assert [(s["tag"], s["step"]) for s in read_spikes(str(tmp_path / "run"))] == [("train/ce_loss", 20)]


def test_the_environment_still_adds_loss_tags_in_each_process(tmp_path, monkeypatch):
    monkeypatch.setenv("TBMEM_LOSS_TAGS", "train/ce_*")  # the training process's: recorded in the run
    _write(tmp_path / "run", spikes=True)
    assert read_settings(str(tmp_path / "run")).loss_tags == ("train/ce_*",)
    assert [(s["tag"], s["step"]) for s in read_spikes(str(tmp_path / "run"))] == [("train/ce_loss", 20)]
    monkeypatch.delenv("TBMEM_LOSS_TAGS")
    _write(tmp_path / "old", tag="val/x")  # a run without settings: the reading process's variable counts
    assert summarize(str(tmp_path), runs=["old"])[0].last_loss == {}
    monkeypatch.setenv("TBMEM_LOSS_TAGS", "val/*")
    assert set(summarize(str(tmp_path), runs=["old"])[0].last_loss) == {"val/x"}


def test_the_module_depth_of_the_writer_is_its_censuses_and_the_runs(tmp_path, monkeypatch):
    monkeypatch.delenv("TBMEM_MODULE_DEPTH", raising=False)
    net = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)), torch.nn.Linear(4, 1))
    with MemoryWriter(tmp_path / "two", every=1, census_every=1, module_depth=2, custom_layout=False) as w:
        w.watch(net).log_memory(0)
    monkeypatch.setenv("TBMEM_MODULE_DEPTH", "1")  # the override, in the training process
    with MemoryWriter(tmp_path / "env", every=1, census_every=1, module_depth=2, custom_layout=False) as w:
        w.watch(net).log_memory(0)
    assert set(censuses(tmp_path / "two")[0]["by_module"]) == {"model.0.0", "model.0.1", "model.1"}
    assert set(censuses(tmp_path / "env")[0]["by_module"]) == {"model.0", "model.1"}
    assert read_settings(str(tmp_path / "two")).module_depth == 2
    assert not (tmp_path / "env" / SETTINGS_LOG).exists()  # depth 1 and no loss tags: the defaults


@pytest.mark.parametrize("adapter", ["transformers", "lightning", "accelerate"])
def test_each_adapter_takes_them_as_the_writers_other_options(adapter, tmp_path):
    module = pytest.importorskip(f"tbmem.integrations.{adapter}")
    make = (lambda **kw: module.MemoryTracker(tmp_path, **kw)) if adapter == "accelerate" else module.MemoryCallback
    assert make().config.module_depth == 2  # the adapters' default (docs/integrations.md)
    cfg = make(loss_tags=["train/ce_loss"], module_depth=1).config
    assert (cfg.loss_tags, cfg.module_depth) == (("train/ce_loss",), 1)
    with pytest.raises(ValueError, match="loss_tags must be a list of tag patterns"):
        make(loss_tags="train/ce_loss")
