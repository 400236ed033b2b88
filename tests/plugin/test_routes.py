"""The plugin's routes on a real tensorboard, checked against the event files read independently."""

from __future__ import annotations

import json
import re

import pytest

from tbmem.analysis import load_scalars, load_texts
from tbmem._internal.analysis.leaks import detect_leaks
from tbmem._internal.logdir.census_log import CensusLog, census_log_path, parse_census_markdown
from tbmem._internal.tags import TAGS
from tests.plugin._logdir import OOM_STEP, SPIKE, get, get_json

MB = 2.0**20


@pytest.fixture(scope="module")
def scalars(logdir_paths):
    return load_scalars(logdir_paths["logdir"])


def test_plugin_is_listed_and_enabled(server):
    listing = get_json(f"{server.base}/data/plugins_listing")
    assert listing["tbmem"]["enabled"] is True
    assert listing["tbmem"]["tab_name"] == "Memory"
    assert listing["tbmem"]["loading_mechanism"] == {"type": "IFRAME", "module_path": "/data/plugin/tbmem/index.js"}


def test_runs_group_ranks(plugin_url, scalars):
    groups = {g["group"]: g for g in get_json(f"{plugin_url}/runs")["groups"]}
    assert [m["run"] for m in groups["exp"]["members"]] == ["exp/rank0", "exp/rank1"]
    assert [m["rank"] for m in groups["exp"]["members"]] == [0, 1]
    (train,) = groups["train"]["members"]
    assert {k: train[k] for k in ("run", "rank", "memory", "census")} == {"run": "train", "rank": None, "memory": True,
                                                                         "census": True}
    # what the page opens on: the most recent run with a census (the wall time of its latest scalar)
    assert train["last_time"] == pytest.approx(scalars[scalars.run == "train"].wall_time.max())
    assert groups["long"]["census"] is False and groups["long"]["memory"] is True


def test_overview_stacks_the_census_exactly(plugin_url, scalars):
    doc = get_json(f"{plugin_url}/overview?run=train&breakdown=category&points=500")
    assert [s["label"] for s in doc["stack"]] == ["parameters", "gradients", "optimizer_state", "buffers",
                                                   "activations", "other"]
    assert doc["census_steps"] == [0, 10, 20]
    x = doc["x"]
    for s in doc["stack"]:
        truth = scalars[(scalars.run == "train") & (scalars.tag == s["tag"])]
        got = {step: v for step, v in zip(x, doc["columns"][s["tag"]]) if v is not None}
        assert got == {int(r.step): r.value * MB for r in truth.itertuples()}
    rss = TAGS["ram_rss"].tag
    assert [line["tag"] for line in doc["lines"]["host"]] == [rss, TAGS["ram_peak_rss"].tag]
    assert "device" not in doc["lines"]  # a CPU run: no VRAM lines, not zeros
    truth = scalars[(scalars.run == "train") & (scalars.tag == rss)]
    got = [v for v in doc["columns"][rss] if v is not None]
    assert got == [v * 2.0**30 for v in truth.value]  # 30 records, fewer than the buckets: all drawn
    marks = {(m["step"], m["kind"]) for m in doc["marks"]}
    assert {(10, "snapshot"), (20, "snapshot")} <= marks


def test_overview_thins_long_series_but_keeps_the_spike(plugin_url):
    tag = TAGS["ram_rss"].tag
    for quick in ("0", "1"):  # the Python loader never samples: quick answers the exact view
        doc = get_json(f"{plugin_url}/overview?run=long&points=100&quick={quick}")
        assert doc["sampled"] == [] and doc["records"][tag] == 1000
        drawn = {x: v for x, v in zip(doc["x"], doc["columns"][tag]) if v is not None}
        assert len(drawn) <= 2 * 100 + 2
        assert drawn[SPIKE[0]] == SPIKE[1] * 2**30 and max(drawn.values()) == SPIKE[1] * 2**30


def test_out_of_memory_steps_are_marked(plugin_url):
    doc = get_json(f"{plugin_url}/overview?run=oom")
    ooms = [m for m in doc["marks"] if m["kind"] == "oom"]
    assert [m["step"] for m in ooms] == [OOM_STEP] and ooms[0]["id"]  # the OOM snapshot, openable
    snaps = get_json(f"{plugin_url}/snapshots?run=oom")
    assert [(s["kind"], s["step"]) for s in snaps] == [("oom", OOM_STEP)]
    assert get(f"{plugin_url}/snapshot?run=oom&id={snaps[0]['id']}")[0] == 200
    # a GPU run: the allocator's OOM counter going up is marked too, and VRAM lines are offered
    long = get_json(f"{plugin_url}/overview?run=long")
    assert [m["step"] for m in long["marks"] if m["kind"] == "oom"] == [500]
    assert [line["label"] for line in long["lines"]["device"]] == ["VRAM allocated", "VRAM reserved",
                                                                   "VRAM peak allocated"]
    assert "host" in long["lines"]


def test_overview_breakdowns(plugin_url, logdir_paths):
    # the census counts every tensor of the process: a tensor another test left alive (an int32 of a gloo
    # group) is in it too, so the dtypes expected are the ones the run's census recorded
    side = CensusLog().read(census_log_path(str(logdir_paths["train"])))
    dtypes = {d for c in side.values() for d in c["by_dtype"]}
    for breakdown, labels in (("dtype", None), ("device", ["cpu"]), ("module", ["model.0", "model.2"])):
        doc = get_json(f"{plugin_url}/overview?run=train&breakdown={breakdown}")
        got = [s["label"] for s in doc["stack"]]
        if labels is None:
            assert got[0] == "float32" and set(got) == dtypes  # the model's float32 first
        else:
            assert got == labels
    status, body, _ = get(f"{plugin_url}/overview?run=train&breakdown=bogus")
    assert status == 400


def test_at_step_gives_the_census_and_the_record(plugin_url, logdir_paths, scalars):
    doc = get_json(f"{plugin_url}/at?run=train&step=13")
    census = doc["census"]
    assert census["step"] == 10 and census["source"] == "census.jsonl" and census["approx"] is False
    side = CensusLog().read(census_log_path(str(logdir_paths["train"])))[10]
    assert census["by_category"] == side["by_category"]
    assert census["where"] == "where the training loop called log_memory"  # shown above the census table
    assert census["large_rule"].startswith("large_tensor_mb=")  # the threshold that applies, named
    # the top-K of the side file is the census's own markdown table of that step, read from the events
    texts = load_texts(logdir_paths["logdir"], runs=["train"])
    markdown = texts[texts.step == 10].value.iloc[0]
    rows = parse_census_markdown(markdown)
    assert [t["name"] for t in census["top"]] == [r["name"] for r in rows]
    assert [t["bytes"] for t in census["top"]] == pytest.approx([r["bytes"] for r in rows], abs=0.0005 * MB)
    record = doc["record"]
    assert record["step"] == 13
    truth = scalars[(scalars.run == "train") & (scalars.step == 13)]
    assert {r["tag"]: r["value"] for r in record["readings"]} == dict(zip(truth.tag, truth.value))


def test_at_step_falls_back_to_scalars_and_text_without_the_side_file(plugin_url, logdir_paths, tmp_path):
    # exp/rank0 has a side file too; hide it for one request to see the data-provider path
    path = census_log_path(str(logdir_paths["logdir"] / "exp" / "rank0"))
    hidden = path + ".hidden"
    import os

    os.rename(path, hidden)
    try:
        doc = get_json(f"{plugin_url}/at?run=exp/rank0&step=8")
    finally:
        os.rename(hidden, path)
    census = doc["census"]
    assert census["source"] == "scalars" and census["approx"] is True and census["step"] == 8
    exact = CensusLog().read(path)[8]  # what the side file says, read back now that it is there again
    assert census["by_category"] == pytest.approx(exact["by_category"], rel=1e-6)  # MB as float32
    assert census["by_category"]["other"] >= 2**20  # the rank's 1 MiB tensor
    assert [t["name"] for t in census["top"]] == [t["name"] for t in exact["top"]]
    assert [t["bytes"] for t in census["top"]] == pytest.approx([t["bytes"] for t in exact["top"]], abs=0.0005 * MB)


def test_a_nan_reading_is_null_not_an_error(plugin_url):
    doc = get_json(f"{plugin_url}/at?run=train&step=5")
    assert {r["tag"]: r["value"] for r in doc["record"]["readings"]}["Loss/diverged"] is None
    assert get_json(f"{plugin_url}/findings?run=train")["summary"]["last_loss"]["Loss/diverged"] is None


def test_at_step_requires_an_integer(plugin_url):
    assert get(f"{plugin_url}/at?run=train&step=abc")[0] == 400
    assert get(f"{plugin_url}/at?run=train")[0] == 400


def test_snapshots_list_tbmem_files_and_pickles_with_opaque_ids(plugin_url):
    snaps = get_json(f"{plugin_url}/snapshots?run=train")
    names = [s["name"] for s in snaps]
    assert "plugins/tbmem/snapshot_rank0_step000000010.json.gz" in names
    assert "memory_snapshot/iteration_20/rank0_memory_snapshot.pickle" in names
    assert "linked_secret.pickle" not in names and not any(n.startswith("linked_dir") for n in names)
    assert all(re.fullmatch(r"[0-9a-f]{16}", s["id"]) for s in snaps)
    assert all("path" not in s for s in snaps)
    real = next(s for s in snaps if s["name"].endswith("rank0_memory_snapshot.pickle"))
    assert real["step"] == 20 and real["format"] == "pickle"


def test_snapshot_pages_embed_the_snapshot_with_a_strict_policy(plugin_url):
    snaps = get_json(f"{plugin_url}/snapshots?run=train")
    for s in snaps:
        if s["name"].startswith("evil"):
            continue
        status, body, headers = get(f"{plugin_url}/snapshot?run=train&id={s['id']}")
        assert status == 200, (s, body[:300])
        assert headers["Content-Type"].startswith("text/html")
        csp = headers["Content-Security-Policy"]
        assert "script-src 'self' 'unsafe-eval' 'sha256-" in csp and "'unsafe-inline'" not in csp.split("script-src")[1]
        page = body.decode()
        assert 'id="tbmem-data"' in page and "default-src 'none'" in page
        head = json.loads(re.search(r'<script type="application/json" id="tbmem-head">(.*?)</script>', page, re.S)[1])
        assert head["snapshots"][0]["step"] == s["step"]


def test_findings_match_tbmem_report(plugin_url, scalars):
    doc = get_json(f"{plugin_url}/findings?run=leaky")
    expected = {f.tag for f in detect_leaks(scalars, runs=["leaky"])}
    assert expected and {f["tag"] for f in doc["leaks"]} == expected
    assert "Memory/Tensor_Category/other_MB" in expected  # the list that keeps 256 KiB per step
    other = next(f for f in doc["leaks"] if f["tag"] == "Memory/Tensor_Category/other_MB")
    assert other["slope_mb_per_1k"] == pytest.approx(250.0, rel=0.05)
    assert "grows" in other["evidence"]
    assert "peak RAM RSS " in doc["summary_text"] and "LEAKS:" in doc["summary_text"]
    clean = get_json(f"{plugin_url}/findings?run=train")
    assert clean["leaks"] == [] and "No leak found" in clean["summary_text"]


def test_ranks_compare_peaks(plugin_url, scalars):
    doc = get_json(f"{plugin_url}/ranks?group=exp")
    by_rank = {r["rank"]: r for r in doc["ranks"]}
    assert set(by_rank) == {0, 1}
    for rank in (0, 1):
        truth = scalars[(scalars.run == f"exp/rank{rank}") & (scalars.tag == TAGS["census_total"].tag)]
        assert by_rank[rank]["peak_census"] == pytest.approx(truth.value.max() * MB)
        assert by_rank[rank]["peak_vram_allocated"] is None
    assert by_rank[1]["peak_census"] - by_rank[0]["peak_census"] == pytest.approx(2**20, rel=1e-3)
    assert get(f"{plugin_url}/ranks?group=nope")[0] == 404


def test_static_assets(plugin_url):
    status, body, headers = get(f"{plugin_url}/index.js")
    assert status == 200 and b"export async function render" in body
    status, body, _ = get(f"{plugin_url}/static/uPlot.iife.min.js")
    assert status == 200 and body.startswith(b"/*! https://github.com/leeoniya/uPlot (v1.6.32) */")
    js = get(f"{plugin_url}/index.js")[1].decode()
    # nothing the page loads comes from elsewhere: every URL it names is relative
    assert not re.search(r"https?://", js)
    for module in ("chart.js", "util.js"):  # what index.js imports, beside it
        status, body, headers = get(f"{plugin_url}/{module}")
        assert status == 200 and headers["Content-Type"].startswith("text/javascript")
        assert not re.search(rb"https?://", body)
    # the colours are tbmem._internal.palette's, given to the page when it is served (one definition everywhere)
    from tbmem._internal import palette

    injected = json.loads(re.search(r"const COLORS = (\{.*?\});", js)[1])
    assert injected == palette.as_json() and injected["categories"]["parameters"] == "#4e79a7"
