"""The frameworks' loss tags (train/loss, train_loss, loss, TBMEM_LOSS_TAGS) are losses for the tab, the spike
detector and tbmem report."""

from __future__ import annotations

import fnmatch

import pytest
from torch.utils.tensorboard import SummaryWriter

from tbmem.analysis import load_scalars
from tbmem._internal.analysis.spikes import find_spikes
from tbmem._internal.plugin.charts import is_step_loss
from tbmem._internal.spikes import SpikeConfig
from tbmem._internal.tags import is_loss_tag


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
