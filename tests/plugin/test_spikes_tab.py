"""A real SyntheticTrainer run whose loss spikes at a known step (tests/_spiked_run.py): the spike detector
finds it at that step, the text entry is in the event file, the snapshot is written, and the Memory tab, in
headless Chromium inside a real TensorBoard, marks the step across its panels with the loss drawn on the
memory chart's step axis. The same run without the injection: nothing found, nothing marked."""

from __future__ import annotations

import os

import pytest

from tbmem._internal.spikes import SPIKES_LOG, SPIKES_TEXT_TAG, read_spikes
from tests._browser import open_tab, wait_until
from tests._events import read_events, scalars, texts
from tests._spiked_run import SPIKE_FACTOR, SPIKE_STEP
from tests.plugin._logdir import Server, get_json


@pytest.fixture(scope="module")
def spike_server(spiked_logdir, tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("tb-spike"), "--logdir", str(spiked_logdir), wait_run="spiked")
    yield srv
    srv.stop()


def test_the_spike_is_found_at_its_step(spiked_logdir):
    """The loss, multiplied at SPIKE_STEP, and its gradient (the same factor) both jump there, and only there."""
    run = spiked_logdir / "spiked"
    spikes = {s["tag"]: s for s in read_spikes(str(run))}
    assert sorted(spikes) == ["Loss/batch", "Train/grad_norm"]
    for tag, spike in spikes.items():
        assert spike["step"] == SPIKE_STEP and spike["kind"] == "spike", spike
        logged = dict(scalars(run, tag))
        assert spike["value"] == pytest.approx(logged[SPIKE_STEP])  # what the trainer logged there
        assert spike["ratio"] > 2 and logged[SPIKE_STEP] > 2 * max(logged[s] for s in range(SPIKE_STEP - 5, SPIKE_STEP))
    entries = texts(run, SPIKES_TEXT_TAG)
    assert [step for step, _ in entries] == [SPIKE_STEP, SPIKE_STEP]
    assert sorted(tag for tag in spikes if any(tag in text for _, text in entries)) == sorted(spikes)
    # one snapshot for the step, named in both entries and both lines
    snap = run / "plugins" / "tbmem" / f"spike_rank0_step{SPIKE_STEP:09d}.json.gz"
    assert sorted(p.name for p in snap.parent.glob("spike_*")) == [snap.name.replace(".json.gz", ".html"), snap.name]
    assert all(f"`{snap}`" in text for _, text in entries) and all(str(snap) in s["snapshot"] for s in spikes.values())
    assert SPIKE_FACTOR > 2


def test_the_same_run_without_the_spike_finds_none(spiked_logdir):
    run = spiked_logdir / "clean"
    assert len(scalars(run, "Loss/batch")) > 40  # the detector had as many values to check
    assert not os.path.exists(run / SPIKES_LOG)
    assert SPIKES_TEXT_TAG + "/text_summary" not in read_events(run).Tags()["tensors"]


def test_the_overview_route_marks_the_spike_and_draws_the_loss(spike_server, spiked_logdir):
    doc = get_json(f"{spike_server.base}/data/plugin/tbmem/overview?run=spiked")
    spikes = [m for m in doc["marks"] if m["kind"] == "spike"]
    assert [m["step"] for m in spikes] == [SPIKE_STEP] and spikes[0]["id"]  # the mark opens its snapshot
    assert "Loss/batch" in spikes[0]["label"] and "Train/grad_norm" in spikes[0]["label"]  # one mark a step
    snaps = get_json(f"{spike_server.base}/data/plugin/tbmem/snapshots?run=spiked")
    assert any(s["id"] == spikes[0]["id"] and s["kind"] == "spike" for s in snaps)
    assert spikes[0]["id"] not in [m["id"] for m in doc["marks"] if m["kind"] != "spike"]  # marked once
    assert doc["loss"] == [{"tag": "Loss/batch", "label": "Loss/batch"}]
    x, loss = doc["x"], doc["columns"]["Loss/batch"]
    around = [loss[x.index(s)] for s in range(SPIKE_STEP - 5, SPIKE_STEP + 6)]
    assert around[5] == max(around) == pytest.approx(dict(scalars(spiked_logdir / "spiked", "Loss/batch"))[SPIKE_STEP])
    clean = get_json(f"{spike_server.base}/data/plugin/tbmem/overview?run=clean")
    assert not [m for m in clean["marks"] if m["kind"] == "spike"]


def test_the_tab_marks_the_spike_across_its_panels(spike_server, browser, tmp_path):
    context, tab, errors = open_tab(browser, f"{spike_server.base}/#tbmem&p.tbmem.run=spiked", width=1280)
    state = "window.tbmemMemoryTab"
    wait_until(tab, f"() => {state} && {state}.chart && {state}.overview && {state}.overview.run === 'spiked'")
    assert tab.evaluate(f"{state}.chart.loss.series.slice(1).map(s => s.label)") == ["Loss/batch"]
    census, lines, loss = (tab.locator(f"#{p}-panel").bounding_box() for p in ("census", "lines", "loss"))
    assert census["y"] + census["height"] <= lines["y"] and lines["y"] + lines["height"] <= loss["y"]
    # the spike's label in the strip above the panels, at its step's x in every panel
    labels = tab.evaluate(f"{state}.chart.labels")
    (label,) = [b for b in labels["placed"] if b["kind"] == "spike"]
    assert label["step"] == SPIKE_STEP and label["text"] == "spike"
    xs = tab.evaluate(f"{state}.chart.plots.map(u => u.valToPos({SPIKE_STEP}, 'x'))")
    assert max(xs) - min(xs) < 1  # one step axis
    tab.page.screenshot(path=str(tmp_path / "spike.png"))
    assert errors == []
    context.close()
