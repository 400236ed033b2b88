"""Real multi-rank jobs: ``torchrun --standalone`` with gloo on CPU, event files read back."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tbmem._internal.tags import TAGS, ranks_tag
from tests._events import read_events
from tests.distributed._torchrun import JOB, torchrun

RSS = TAGS["ram_rss"].tag
TREE = TAGS["ram_tree_rss"].tag
STEP_TIME = TAGS["step_time"].tag
STEPS = 6


def _series(run: Path, tag: str) -> dict[int, float]:
    acc = read_events(run)
    if tag not in acc.Tags()["scalars"]:
        return {}
    return {e.step: e.value for e in acc.Scalars(tag)}


def _ok(proc) -> None:  # noqa: ANN001
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


@pytest.fixture(scope="module", params=[2, 4], ids=["2ranks", "4ranks"])
def aggregate_job(request, tmp_path_factory):
    world = request.param
    log_dir = tmp_path_factory.mktemp(f"job{world}")
    proc = torchrun(world, JOB, "aggregate", str(log_dir), str(STEPS), timeout=420)
    _ok(proc)
    return world, log_dir


def test_every_rank_writes_its_own_folder(aggregate_job):
    world, log_dir = aggregate_job
    assert sorted(p.name for p in log_dir.iterdir()) == sorted(f"rank{r}" for r in range(world))
    for r in range(world):
        assert sorted(_series(log_dir / f"rank{r}", RSS)) == list(range(STEPS))
        assert sorted(_series(log_dir / f"rank{r}", TREE)) == list(range(STEPS))
        ranks_tags = [t for t in read_events(log_dir / f"rank{r}").Tags()["scalars"] if t.startswith("Ranks/")]
        assert bool(ranks_tags) == (r == 0), f"rank {r} wrote {ranks_tags[:3]}"


def test_rank0_aggregates_equal_the_ranks_values_at_every_common_step(aggregate_job):
    world, log_dir = aggregate_job
    root = log_dir / "rank0"
    for tag in (RSS, TREE, STEP_TIME):
        per_rank = [_series(log_dir / f"rank{r}", tag) for r in range(world)]
        common = sorted(set.intersection(*(set(s) for s in per_rank)))
        assert len(common) >= (STEPS - 1 if tag == STEP_TIME else STEPS)  # no step time at the first record
        agg = {stat: _series(root, ranks_tag(stat, tag)) for stat in ("max", "min", "mean", "argmax")}
        for step in common:
            values = [s[step] for s in per_rank]
            assert agg["max"][step] == pytest.approx(max(values), rel=1e-6), (tag, step)
            assert agg["min"][step] == pytest.approx(min(values), rel=1e-6), (tag, step)
            assert agg["mean"][step] == pytest.approx(sum(values) / world, rel=1e-5), (tag, step)
            assert values[int(agg["argmax"][step])] == max(values)
        assert set(agg["max"]) == set(common)
    assert set(_series(root, TAGS["ranks_reporting"].tag).values()) == {float(world)}


def test_argmax_names_the_rank_holding_80_mb_more(aggregate_job):
    world, log_dir = aggregate_job
    heavy = world - 1
    argmax = _series(log_dir / "rank0", ranks_tag("argmax", RSS))
    assert set(argmax.values()) == {float(heavy)}
    rss = [_series(log_dir / f"rank{r}", RSS) for r in range(world)]
    for step in range(STEPS):
        lighter = max(rss[r][step] for r in range(world) if r != heavy)
        assert (rss[heavy][step] - lighter) * 1024 > 60  # MB: the 80 MB block, less the ranks' noise


def test_rank0_layout_has_margin_charts(aggregate_job):
    from tensorboard.backend.event_processing import event_file_loader
    from tensorboard.plugins.custom_scalar import layout_pb2

    _, log_dir = aggregate_job
    margins = {}
    for path in (log_dir / "rank0").glob("events.out.tfevents.*"):
        for event in event_file_loader.EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                if value.tag == "custom_scalars__config__":
                    layout = layout_pb2.Layout.FromString(value.tensor.string_val[0])
                    for cat in layout.category:
                        for chart in cat.chart:
                            if chart.HasField("margin"):
                                s = chart.margin.series[0]
                                margins[chart.title] = (s.value, s.lower, s.upper)
    title = "Process RSS across ranks (GB): mean, min..max"
    assert margins[title] == (ranks_tag("mean", RSS), ranks_tag("min", RSS), ranks_tag("max", RSS))


def test_a_rank_with_a_failing_probe_does_not_hang_the_job(tmp_path):
    proc = torchrun(2, JOB, "failing_probe", str(tmp_path), str(STEPS), timeout=300)
    _ok(proc)
    # a failing probe is retried and switched off after repeated failures (docs/reliability.md)
    assert "the host probe failed" in proc.stderr
    assert _series(tmp_path / "rank1", RSS) == {}  # no reading on rank 1 ...
    assert sorted(_series(tmp_path / "rank1", TREE)) == list(range(STEPS))  # ... the other probes go on
    rank0 = _series(tmp_path / "rank0", RSS)
    root = tmp_path / "rank0"
    assert _series(root, ranks_tag("max", RSS)) == pytest.approx(rank0, rel=1e-6)  # rank 1 sent NaN
    assert set(_series(root, ranks_tag("argmax", RSS)).values()) == {0.0}
    assert set(_series(root, TAGS["ranks_reporting"].tag).values()) == {2.0}  # rank 1 joined every record


def test_simulated_oom_on_rank_1_leaves_snapshots_from_both_ranks(tmp_path):
    from tbmem._internal.snapshot.readers import load_snapshot

    proc = torchrun(2, JOB, "oom", str(tmp_path), str(STEPS), timeout=300)
    assert proc.returncode != 0  # rank 1's error reached the user and ended the job
    assert "torch.OutOfMemoryError: simulated" in proc.stderr
    (own,) = (tmp_path / "rank1" / "plugins" / "tbmem").glob("oom_rank1_step000000003.json.gz")
    (peer,) = (tmp_path / "rank0" / "plugins" / "tbmem").glob("oom_rank0_step*.json.gz")
    snap = load_snapshot(str(own))
    assert (snap.kind, snap.rank, snap.step) == ("oom", 1, 3)
    assert snap.meta["exception"].startswith("OutOfMemoryError: simulated")
    other = load_snapshot(str(peer))
    assert (other.kind, other.rank, other.step) == ("oom", 0, 3)  # rank 0 was inside step 3
    assert "rank 1 ran out of memory at its step 3" in other.meta["exception"]
    assert int(other.allocs["size"].sum()) == (64 * 64 + 64) * 4 * 2  # its parameters and gradients


@pytest.mark.parametrize("scenario,message", [
    ("skew", "the ranks called log_memory with different steps"),
    ("linger", "a rank closed its writer without joining it"),
    ("shifted", "ranks called log_memory with different steps: rank 0 at step 0, rank 1 at step 1"),
])
def test_ranks_out_of_step_degrade_instead_of_hanging(tmp_path, scenario, message):
    proc = torchrun(2, JOB, scenario, str(tmp_path), str(STEPS), timeout=300)
    _ok(proc)
    assert message in proc.stderr
    assert "cross-rank aggregates are switched off" in proc.stderr
    written = _series(tmp_path / "rank0", ranks_tag("max", RSS))
    if scenario == "shifted":
        assert written == {}  # no aggregate from gathers that paired different steps
    else:
        assert sorted(written) == list(range(STEPS - 1))  # every record both ranks joined
    assert all(math.isfinite(v) for v in written.values())


def test_tensorboard_serves_the_margin_chart_of_a_job(aggregate_job, tmp_path):
    import json
    import re
    import socket
    import subprocess
    import sys
    import time
    import urllib.parse
    import urllib.request

    world, log_dir = aggregate_job
    if world != 2:
        pytest.skip("one TensorBoard start is enough")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = f"http://127.0.0.1:{port}"

    def get(path: str):  # noqa: ANN202
        with urllib.request.urlopen(base + path, timeout=5) as response:
            return json.loads(response.read())

    exe = Path(sys.executable).with_name("tensorboard")
    log = tmp_path / "tensorboard.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen([str(exe), "--logdir", str(log_dir), "--host", "127.0.0.1", "--port", str(port),
                                 "--load_fast", "false"], stdout=sink, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if {"rank0", "rank1"} <= set(get("/data/plugin/scalars/tags")):
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, log.read_text()[-3000:]
            time.sleep(0.5)
        layout = get("/data/plugin/custom_scalars/layout")
        (ranks,) = [c for c in layout["category"] if c["title"] == "tbmem: ranks"]
        chart = next(c for c in ranks["chart"] if c["title"].startswith("Process RSS across ranks"))
        series = chart["margin"]["series"][0]
        assert (series["value"], series["lower"], series["upper"]) == tuple(
            ranks_tag(s, RSS) for s in ("mean", "min", "max"))
        # what the margin chart asks for: each of its three tags, from rank 0's run
        query = urllib.parse.urlencode({"run": "rank0", "tag": re.escape(series["upper"])})
        points = get(f"/data/plugin/custom_scalars/scalars?{query}")["tag_to_events"][series["upper"]]
        rss = [_series(log_dir / f"rank{r}", RSS) for r in range(world)]
        assert [p[1] for p in points] == list(range(STEPS))
        assert [p[2] for p in points] == pytest.approx([max(s[k] for s in rss) for k in range(STEPS)], rel=1e-6)
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_a_writer_on_rank_0_only_does_not_stall_the_job(tmp_path):
    proc = torchrun(2, JOB, "rank0_only", str(tmp_path), str(STEPS), timeout=300)
    _ok(proc)
    assert "only 1 of the 2 ranks had a tbmem writer at the first record" in proc.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["rank0"]
    assert sorted(_series(tmp_path / "rank0", RSS)) == list(range(STEPS))
    assert _series(tmp_path / "rank0", ranks_tag("max", RSS)) == {}
