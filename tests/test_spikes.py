"""Loss spikes (tbmem._internal.spikes): the rule, and a real training loop whose loss is made to spike at a known
step: found at that step, the text entry read back from the event file, the side file's line, the snapshot
written; a failing detector is switched off, never training."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

from tbmem import MemoryWriter, MemoryWriterConfig
from tbmem._internal.spikes import SPIKES_LOG, SPIKES_TEXT_TAG, SpikeConfig, SpikeDetector, SpikeMonitor, read_spikes
from tests._events import read_events, texts

SPIKE_STEP = 37


def _feed(detector, tag, values, start=0):
    return [(s, sp) for s, v in enumerate(values, start) if (sp := detector.update(tag, s, v)) is not None]


def test_a_value_above_factor_times_the_median_is_a_spike_once_per_episode():
    det = SpikeDetector(SpikeConfig(window=10, min_history=5))
    falling = [1.0 / (1 + 0.1 * i) for i in range(20)]  # a loss that falls is never a spike
    assert _feed(det, "Loss/batch", falling) == []
    found = _feed(det, "Loss/batch", [3.0, 3.1, 0.5, 3.0], start=20)  # 3.0 and 3.1: one episode; then again
    assert [s for s, _ in found] == [20, 23]
    spike = found[0][1]
    assert spike.median == pytest.approx(sorted(falling[-10:])[4] / 2 + sorted(falling[-10:])[5] / 2)
    assert spike.ratio == pytest.approx(3.0 / spike.median) and spike.kind == "spike"


def test_patience_reports_the_first_step_above_the_line():
    det = SpikeDetector(SpikeConfig(window=10, min_history=5, patience=3))
    assert _feed(det, "Loss/train", [1.0] * 10 + [5.0, 5.0, 1.0]) == []  # two in a row: not enough
    (found,) = _feed(det, "Loss/train", [5.0, 6.0, 7.0, 8.0], start=13)
    assert found[0] == 15 and found[1].step == 13 and found[1].confirmed_step == 15 and found[1].value == 5.0


def test_what_is_watched_and_what_is_not():
    det = SpikeDetector(SpikeConfig(window=5, min_history=3))
    assert det.watches("Loss/batch") and det.watches("Loss/iteration") and det.watches("Train/grad_norm")
    assert not det.watches("Loss/evaluation")  # L-BFGS-B line-search trials overshoot by design
    assert not det.watches("LBFGS/grad_norm")  # and its iterates' gradient rises and falls (tests/trainers)
    assert not det.watches("Memory/RAM/process_rss_GB")
    assert _feed(det, "Loss/evaluation", [1.0] * 5 + [100.0]) == []
    # a NaN is a spike at once; a non-positive median (a log-likelihood) is checked for that only
    (nan,) = _feed(det, "Loss/nll", [-2.0, -2.1, -2.2, -1.0, float("nan")])
    assert nan[0] == 4 and nan[1].kind == "nonfinite" and math.isnan(nan[1].value)


@pytest.mark.parametrize("bad, message", [
    ({"factor": 1}, "factor must be a number > 1"),
    ({"window": 2}, "window must be an integer >= 3"),
    ({"min_history": 20, "window": 10}, r"min_history \(20\) must be <= window \(10\)"),
    ({"tags": "Loss/*"}, "tags must be a list of tag patterns"),
    ({"patience": 0}, "patience must be an integer >= 1"),
    ({"snapshot": "yes"}, "snapshot must be true or false"),
])
def test_config_names_the_bad_field(bad, message):
    with pytest.raises(ValueError, match=message):
        SpikeConfig(**bad)


def test_writer_config_accepts_true_and_mappings():
    assert MemoryWriterConfig(spikes=True).spikes == SpikeConfig()
    assert MemoryWriterConfig(spikes=False).spikes is None
    assert MemoryWriterConfig.from_mapping({"spikes": {"factor": 3, "tags": ["Loss/train"]}}).spikes.tags == ("Loss/train",)
    with pytest.raises(ValueError, match=r"unknown SpikeConfig key 'facter' \(did you mean 'factor'\?\)"):
        MemoryWriterConfig(spikes={"facter": 3})


def _train(run_dir, *, spike_at=None, add_scalar=False, snapshot=True):
    """A small regression trained with Adam; at ``spike_at`` the batch's targets are scaled by 30, which
    makes that step's real loss jump; the optimizer skips that batch (as a loop guarding against bad
    batches would), so the steps after it are not disturbed."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    w_true = torch.randn(16, 1)
    with MemoryWriter(run_dir, every=1, census_every=0, custom_layout=False,
                      spikes={"snapshot": snapshot}) as writer:  # the default rule
        writer.watch(model, opt)
        for step in range(60):
            x = torch.randn(64, 16)
            y = x @ w_true
            if step == spike_at:
                y = y * 30
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            if step != spike_at:
                opt.step()
            writer.log_memory(step)
            if add_scalar:
                writer.add_scalar("Loss/batch", loss.detach(), step)  # a tensor, as loops often pass
            else:
                writer.write_scalars({"Loss/batch": loss.item()}, step)
        return writer._spikes.found


@pytest.mark.parametrize("add_scalar", [False, True], ids=["write_scalars", "add_scalar"])
def test_an_injected_spike_is_found_at_its_step_with_text_side_file_and_snapshot(tmp_path, add_scalar, tbmem_log):
    found = _train(tmp_path, spike_at=SPIKE_STEP, add_scalar=add_scalar)
    assert [s.step for s in found] == [SPIKE_STEP] and found[0].tag == "Loss/batch" and found[0].ratio > 10
    (entry,) = texts(tmp_path, SPIKES_TEXT_TAG)
    assert entry[0] == SPIKE_STEP and "**Spike** at step 37" in entry[1] and "Snapshot written" in entry[1]
    (line,) = read_spikes(str(tmp_path))
    assert line["step"] == SPIKE_STEP and line["tag"] == "Loss/batch" and line["value"] == pytest.approx(found[0].value)
    snap = os.path.join(tmp_path, "plugins", "tbmem", f"spike_rank0_step{SPIKE_STEP:09d}.json.gz")
    assert os.path.isfile(snap) and line["snapshot"][0] == snap
    from tbmem._internal.snapshot.schema import read_json_gz

    assert read_json_gz(snap).kind == "spike" and read_json_gz(snap).step == SPIKE_STEP
    warnings = [r.getMessage() for r in tbmem_log.records if "tbmem spike at step 37" in r.getMessage()]
    assert len(warnings) == 1


def test_the_same_loop_without_the_injection_finds_nothing(tmp_path):
    assert _train(tmp_path, spike_at=None, snapshot=False) == []
    assert not os.path.exists(os.path.join(tmp_path, SPIKES_LOG))
    assert SPIKES_TEXT_TAG + "/text_summary" not in read_events(tmp_path).Tags()["tensors"]


def test_a_failing_detector_is_reported_once_and_switched_off(tmp_path, monkeypatch, tbmem_log):
    def broken(self, tag, step, value):
        raise RuntimeError("detector exploded")

    monkeypatch.setattr(SpikeDetector, "update", broken)
    with MemoryWriter(tmp_path, census_every=0, spikes=True) as w:
        for step in range(5):
            w.write_scalars({"Loss/batch": 1.0}, step)
            w.add_scalar("Loss/other", 1.0, step)
        assert w._spikes.off
    failures = [r for r in tbmem_log.records if "spike detector failed" in r.getMessage()]
    assert len(failures) == 1 and "detector exploded" in failures[0].getMessage()


def test_side_file_lines_are_plain_json(tmp_path):
    monitor = SpikeMonitor(SpikeConfig(window=5, min_history=3), emit=None)
    for step, v in enumerate([1.0, 1.0, 1.0, float("inf")]):
        monitor.on_scalars({"Loss/x": v}, step)
    (spike,) = monitor.found
    assert json.loads(json.dumps(spike.to_json(), allow_nan=False))["value"] == "inf"


def test_the_rolling_median_is_the_median_of_the_last_window_values():
    import random
    import statistics

    rng = random.Random(3)
    det = SpikeDetector(SpikeConfig(window=7, min_history=3, factor=1e9))
    seen = []
    for step in range(300):
        v = rng.choice([rng.random(), 0.5, 0.25])  # repeated values too
        det.update("Loss/x", step, v)
        seen.append(v)
        assert det._tracks["Loss/x"].median() == statistics.median(seen[-7:])
