"""Both trainers with ``tbmem.profile`` on: traces that load, follow the trace-event format, and agree
with the event files (counters equal the records at the same steps; step slices are the steps logged)."""

from __future__ import annotations

from pathlib import Path

from tests._events import read_events
from tbmem._internal.logdir.traces import list_traces, trace_path
from tests.profile._trace import check_spec, counters_match_events, load_gz
from tbmem._internal.profile.tracks import CATEGORY_TRACK
from trainers.experiment import run_experiment


def _traces(run_dir):
    return [Path(trace_path(str(run_dir), t["name"])) for t in list_traces(str(run_dir))]


def test_synthetic_trainer_writes_profile_windows(compose, tmp_path):
    cfg = compose("burgers_quick_test", "trainer=synthetic_with_memory", "trainer_params.epochs=2",
                  "tbmem.census_every=50", "tbmem.profile={every: 4, steps: 2, start: 4, max_windows: 2}")
    out = run_experiment(cfg, log_dir=tmp_path / "run")
    paths = _traces(out.log_dir)
    assert [p.relative_to(out.log_dir).as_posix() for p in paths] == [
        "plugins/tbmem/traces/step000000004/rank0.pt.trace.json.gz",
        "plugins/tbmem/traces/step000000008/rank0.pt.trace.json.gz"]
    acc = read_events(out.log_dir)
    rss_steps = {e.step for e in acc.Scalars("Memory/RAM/process_rss_GB")}
    for path, first in zip(paths, (4, 8)):
        doc = load_gz(path)
        check_spec(doc)
        steps = doc["tbmem"]["summary"]["steps"]
        assert [s["step"] for s in steps] == [first, first + 1]
        assert {first, first + 1} <= rss_steps  # a record at every step of a window
        names = {e["name"] for e in doc["traceEvents"] if e.get("cat") == "tbmem" and e["ph"] == "X"}
        assert {f"step {first}", f"step {first + 1}", "forward", "backward", "optimizer"} <= names
        cats = [e for e in doc["traceEvents"] if e.get("name") == CATEGORY_TRACK]
        assert cats and {"parameters", "gradients"} <= set(cats[-1]["args"])
        assert counters_match_events(doc, out.log_dir) >= 6
        split = doc["tbmem"]["summary"]["split_us"]
        assert split["forward"] > 0 and split["backward"] > 0 and split["optimizer"] > 0
        assert sum(split.values()) <= doc["tbmem"]["summary"]["total_us"] * 1.0001 + 1
        ops = {e["name"] for e in doc["traceEvents"] if e.get("cat") == "cpu_op"}
        assert "aten::convolution" in ops or "aten::conv2d" in ops or "aten::conv1d" in ops


def test_physical_trainer_writes_profile_windows(compose, tmp_path):
    cfg = compose("burgers_physical_quick_test", "trainer=physical_with_memory",
                  "tbmem.profile={every: 2, steps: 2, start: 2, max_windows: 2}")
    out = run_experiment(cfg, log_dir=tmp_path / "run")
    assert out.result.evaluations_seen >= 6  # both windows are whole: each loss evaluation is a step
    paths = _traces(out.log_dir)
    assert [p.relative_to(out.log_dir).as_posix() for p in paths] == [
        "plugins/tbmem/traces/step000000002/rank0.pt.trace.json.gz",
        "plugins/tbmem/traces/step000000004/rank0.pt.trace.json.gz"]
    for path, first in zip(paths, (2, 4)):
        doc = load_gz(path)
        check_spec(doc)
        assert [s["step"] for s in doc["tbmem"]["summary"]["steps"]] == [first, first + 1]
        assert counters_match_events(doc, out.log_dir) >= 2
        assert doc["tbmem"]["summary"]["operators"]["by_self_time"]
        # PhiML's backend profiler around each loss evaluation, on the window's clock: its calls lie in the
        # evaluation's step slice, and carry the bytes torch.profiler saw allocated in them
        steps = doc["tbmem"]["summary"]["steps"]
        names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "process_name"}
        backend = [e for e in doc["traceEvents"] if names.get(e.get("pid")) == "PhiML backend" and e["ph"] == "X"]
        assert len(backend) > 10
        slack = doc["tbmem"]["clock"]["uncertainty_us"] + 100
        for e in backend:
            assert any(s["ts"] - slack <= e["ts"] and e["ts"] + e["dur"] <= s["ts"] + s["dur"] + slack for s in steps), e
        memory = [e for e in doc["traceEvents"] if e.get("name") == "[memory]"]

        def allocated(e):
            return sum(m["args"]["Bytes"] for m in memory if m["args"]["Bytes"] > 0
                       and e["ts"] <= m["ts"] <= e["ts"] + e["dur"])

        assert all(e["args"]["tbmem allocated bytes"] == allocated(e) for e in backend)
        assert doc["tbmem"]["summary"]["external"]["source"] == "PhiML"
        # PhiFlow's field operations as named ranges, with their bytes: a call per frame and substep, two
        # evaluations a window
        ops = {r["name"]: r for r in doc["tbmem"]["summary"]["field_operations"]["by_time"]}
        calls = 2 * cfg.trainer_params.num_predict_steps * cfg.data.substeps
        assert ops["phiflow::diffuse.explicit"]["count"] == ops["phiflow::advect.differential"]["count"] == calls
        assert ops["phiflow::diffuse.explicit"]["allocated_bytes"] > 0
        ranges = [e for e in doc["traceEvents"] if e.get("name") == "phiflow::diffuse.explicit"]
        assert ops["phiflow::diffuse.explicit"]["allocated_bytes"] == sum(allocated(e) for e in ranges)
