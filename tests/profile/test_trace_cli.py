"""``tbmem trace``: a job's ranks as processes, steps on the time axis, counters equal to the event files."""

from __future__ import annotations

import math

import torch

from tests._events import read_events
from tests.profile._trace import check_spec, load_gz
from tbmem import MemoryWriter
from tbmem._internal.cli import main
from tbmem._internal.profile.tracks import CATEGORY_PREFIX, CATEGORY_TRACK, TRACKS


def _job(tmp_path):
    job = tmp_path / "job"
    for rank in (0, 1):
        model = torch.nn.Linear(32 * (rank + 1), 32)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with MemoryWriter(job / f"rank{rank}", every=2, census_every=4,
                          snapshot={"steps": [4], "every": 0}) as w:
            w.watch(model, opt)
            for step in range(9):
                model(torch.randn(8, 32 * (rank + 1))).sum().backward()
                opt.step()
                w.log_memory(step)
    return job


def test_trace_of_a_job(tmp_path, capsys):
    job = _job(tmp_path)
    out = tmp_path / "job.json.gz"
    assert main(["trace", str(job), "-o", str(out)]) == 0
    assert "trace of 2 run(s)" in capsys.readouterr().out
    doc = load_gz(out)
    check_spec(doc)
    assert doc["tbmem"]["processes"] == {"1": "rank0", "2": "rank1"}
    events = doc["traceEvents"]
    for rank in (0, 1):
        acc = read_events(job / f"rank{rank}")
        rss = {e.step: e.value for e in acc.Scalars("Memory/RAM/process_rss_GB")}
        slices = sorted(e["args"]["step"] for e in events if e["pid"] == rank + 1 and e["ph"] == "X")
        assert slices == sorted(rss) == [0, 2, 4, 6, 8]  # one slice per step recorded
        compared = 0
        for e in (e for e in events if e["pid"] == rank + 1 and e["ph"] == "C"):
            step = e["ts"] / 1000
            assert step == int(step)  # steps are the time axis
            for series, value in e["args"].items():
                tag = CATEGORY_PREFIX + series + "_MB" if e["name"] == CATEGORY_TRACK else TRACKS[e["name"]][series]
                logged = {ev.step: ev.value for ev in acc.Scalars(tag)}
                assert math.isclose(value, logged[int(step)], rel_tol=1e-6), (tag, step)
                compared += 1
        params = [e for e in events if e["pid"] == rank + 1 and e.get("name") == CATEGORY_TRACK]
        assert [e["ts"] for e in params] == [0, 4000, 8000] and compared > 10
        snaps = [e for e in events if e["pid"] == rank + 1 and e["ph"] == "i"]
        assert [(e["name"], e["ts"]) for e in snaps] == [("snapshot", 4000)]
    # the categories differ by rank as the models do
    first = {e["pid"]: e["args"]["parameters"] for e in events if e.get("name") == CATEGORY_TRACK and e["ts"] == 0}
    assert first[2] > first[1] > 0


def test_trace_of_nothing_fails_in_one_line(tmp_path, capsys):
    assert main(["trace", str(tmp_path), "-o", str(tmp_path / "t.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tbmem trace: ") and err.count("\n") == 1
