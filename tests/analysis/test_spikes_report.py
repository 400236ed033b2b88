"""`tbmem report` lists loss spikes with the memory change around each: the spike a real trainer run found
online (tests/_spiked_run.py) with numbers equal to its event files', a spike found by the report itself in
a run logged without the detector, and none in the demo trainers' real losses (no false positive)."""

from __future__ import annotations

import json
import os

from tbmem.analysis import load_scalars
from tbmem._internal.cli import main
from tbmem._internal.spikes import SPIKES_LOG, SpikeConfig, SpikeDetector
from tests._spiked_run import SPIKE_STEP
from tests.analysis._logdirs import write_run


def _report(capsys, *argv):
    code = main(["report", *map(str, argv)])
    out, err = capsys.readouterr()
    assert code == 0 and err == "", err
    return out


def test_the_spike_and_the_memory_around_it(spiked_logdir, capsys):
    data = json.loads(_report(capsys, spiked_logdir, "--json"))
    assert sorted((s["run"], s["tag"], s["step"], s["source"]) for s in data["spikes"]) == [
        ("spiked", "Loss/batch", SPIKE_STEP, "online"), ("spiked", "Train/grad_norm", SPIKE_STEP, "online")]
    (spike,) = [s for s in data["spikes"] if s["tag"] == "Loss/batch"]
    assert spike["snapshot"][0].endswith(f"spike_rank0_step{SPIKE_STEP:09d}.json.gz")
    df = load_scalars(spiked_logdir, runs=["spiked"])
    rss = df[df["tag"] == "Memory/RAM/process_rss_GB"].set_index("step")["value"]
    (around,) = [m for m in spike["memory"] if m["label"] == "RSS"]
    assert (around["before_step"], around["after_step"]) == (SPIKE_STEP - 1, SPIKE_STEP)  # tbmem.every = 1
    assert around["before"] == rss[SPIKE_STEP - 1] and around["after"] == rss[SPIKE_STEP]
    assert around["delta"] == rss[SPIKE_STEP] - rss[SPIKE_STEP - 1]
    assert {m["label"] for m in spike["memory"]} == {"RSS", "peak RSS"}  # a CPU run: no VRAM
    text = _report(capsys, spiked_logdir)
    (line,) = [x for x in text.splitlines() if x.startswith("  spiked: Loss/batch")]
    assert f"at step {SPIKE_STEP}," in line and f"(step {SPIKE_STEP - 1}) -> " in line and "spike_rank0_step" in line


def test_a_run_logged_without_the_detector_is_checked_by_the_report(tmp_path, capsys):
    write_run(tmp_path / "r", range(40), lambda s: {"Loss/batch": 1.0 + 0.01 * (s % 3) + (8.0 if s == 30 else 0.0),
                                                    "Memory/RAM/process_rss_GB": 1.0 + (0.5 if s >= 30 else 0.0)})
    (spike,) = json.loads(_report(capsys, tmp_path, "--json"))["spikes"]
    assert (spike["step"], spike["source"]) == (30, "report") and spike["memory"][0]["delta"] == 0.5
    assert "(found by tbmem report)" in _report(capsys, tmp_path)


def test_no_false_positive_on_the_demo_trainers_real_losses(demo_logdir, spiked_logdir, capsys):
    """make demo's two runs (the detector on in both configs) and the spiked run's twin without the spike."""
    for root in (demo_logdir, spiked_logdir):
        runs = [r for r in sorted(p.parent for p in root.rglob("events.out.tfevents*")) if r.name != "spiked"]
        for run in runs:
            assert not os.path.exists(run / SPIKES_LOG), run
            df = load_scalars(run)
            detector = SpikeDetector(SpikeConfig())
            checked = 0
            for tag in [t for t in df["tag"].unique() if detector.watches(t)]:
                values = df[df["tag"] == tag].sort_values("step")
                checked += max(0, len(values) - SpikeConfig().min_history)
                assert [detector.update(tag, s, v) for s, v in zip(values["step"], values["value"])] == \
                    [None] * len(values), (run, tag)
            if "physical" not in str(run):
                assert checked > 30, run  # Loss/batch: the rule had values to judge
    data = json.loads(_report(capsys, demo_logdir, "--json"))
    assert data["spikes"] == [] and len(data["runs"]) == 2
    assert "No loss spike" in _report(capsys, demo_logdir)

