"""Profile windows in a MemoryWriter: when they open, one clock with torch.profiler, the summary, an OOM."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import record_function

from tests.profile._trace import check_spec, counters_match_events, load_gz
from tbmem import MemoryWriter, MemoryWriterConfig
from tbmem._internal.logdir.traces import list_traces, trace_path
from tbmem._internal.profile import ProfileConfig
from tbmem._internal.profile.merge import operator_rows
from tbmem._internal.snapshot.markers import mark


def test_config_errors_name_the_field_and_unknown_keys():
    with pytest.raises(ValueError, match="ProfileConfig.every must be a positive integer, got 0"):
        ProfileConfig(every=0)
    with pytest.raises(ValueError, match="ProfileConfig.with_stack must be true or false"):
        ProfileConfig(with_stack="yes")
    with pytest.raises(ValueError, match=r"unknown ProfileConfig key 'step' \(did you mean 'steps'\?\)"):
        MemoryWriterConfig(profile={"step": 3})
    assert MemoryWriterConfig(profile={"every": 20, "steps": 2}).profile == ProfileConfig(every=20, steps=2)
    assert MemoryWriterConfig(profile=True).profile == ProfileConfig()
    with pytest.raises(TypeError):
        ProfileConfig(20, 2)  # keyword-only


def _loop(w, model, steps, *, phases=True, begin=True):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    w.watch(model, opt)
    for step in range(steps):
        if begin:
            w.begin_step(step)
        if phases:
            mark(f"step {step}", kind="step")
            mark("forward", kind="phase")
        with record_function("user::forward"):
            loss = model(torch.randn(16, 64)).pow(2).mean()
        if phases:
            mark("backward", kind="phase")
        loss.backward()
        if phases:
            mark("optimizer", kind="phase")
        opt.step()
        opt.zero_grad(set_to_none=True)
        w.log_memory(step)


def test_windows_open_every_n_steps_and_one_clock_holds(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    with MemoryWriter(tmp_path, every=50, census_every=100,
                      profile={"every": 10, "steps": 3, "start": 10, "max_windows": 2}) as w:
        _loop(w, model, 40)
        assert not torch.autograd.profiler._is_profiler_enabled  # nothing runs between windows
        assert w._components.wake_at > 30  # the step path wakes the windows' hooks again at the next window
    assert [t["step"] for t in list_traces(str(tmp_path))] == [10, 20]  # max_windows
    doc = load_gz(trace_path(str(tmp_path), list_traces(str(tmp_path))[0]["name"]))
    check_spec(doc)
    clock = doc["tbmem"]["clock"]
    assert clock["uncertainty_us"] < 1000
    ev = doc["traceEvents"]
    steps = doc["tbmem"]["summary"]["steps"]
    assert [s["step"] for s in steps] == [10, 11, 12]
    # one clock: each user range torch.profiler recorded lies in tbmem's "forward" phase of its step,
    # both ends within the alignment's bound (plus the cost of a mark call)
    user = sorted((e for e in ev if e.get("name") == "user::forward"), key=lambda e: e["ts"])
    forward = sorted((e for e in ev if e.get("cat") == "tbmem" and e.get("name") == "forward"), key=lambda e: e["ts"])
    assert len(user) == len(forward) == 3
    slack = clock["uncertainty_us"] + 500
    for u, f in zip(user, forward):
        assert f["ts"] - slack <= u["ts"] and u["ts"] + u["dur"] <= f["ts"] + f["dur"] + slack
        assert u["ts"] - f["ts"] < slack  # the range starts right after the mark
    for s, u in zip(steps, user):
        assert s["ts"] - slack <= u["ts"] <= s["ts"] + s["dur"]
    assert counters_match_events(doc, tmp_path) >= 3 * 2
    split = doc["tbmem"]["summary"]["split_us"]
    assert split["forward"] > 0 and split["backward"] > 0 and split["optimizer"] > 0


def test_summary_operators_are_key_averages_of_the_window(tmp_path):
    model = torch.nn.Linear(64, 64)
    with MemoryWriter(tmp_path, every=50, census_every=0, profile={"every": 5, "steps": 2, "start": 5,
                                                                   "max_windows": 1}) as w:
        _loop(w, model, 8, phases=False, begin=False)
        prof = w._profile.last_profiler
    doc = load_gz(trace_path(str(tmp_path), list_traces(str(tmp_path))[0]["name"]))
    ops = doc["tbmem"]["summary"]["operators"]
    averages = {a.key: a for a in prof.key_averages()}
    top = sorted(averages.values(), key=lambda a: -a.self_cpu_time_total)[:10]
    assert [r["name"] for r in ops["by_self_time"]] == [a.key for a in top]
    for row in ops["by_self_time"]:
        assert row["self_cpu_us"] == pytest.approx(averages[row["name"]].self_cpu_time_total)
        assert row["count"] == averages[row["name"]].count
    assert ops == operator_rows(prof)
    assert ops["by_bytes"] and all(r["self_bytes"] > 0 for r in ops["by_bytes"])
    # without begin_step the window opens at the end of step 4 and its first step starts there
    assert [s["step"] for s in doc["tbmem"]["summary"]["steps"]] == [5, 6]


def test_an_oom_in_a_window_is_an_instant_and_the_trace_is_written(tmp_path):
    with MemoryWriter(tmp_path, every=50, census_every=0, profile={"every": 5, "steps": 3, "start": 5}) as w:
        _loop(w, torch.nn.Linear(64, 64), 6)  # the window [5, 8) is open after step 5
        w.step_failed(6, torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
        assert w._profile.window is None
    (entry,) = list_traces(str(tmp_path))
    doc = load_gz(trace_path(str(tmp_path), entry["name"]))
    check_spec(doc)
    (oom,) = [e for e in doc["traceEvents"] if e.get("name") == "out of memory"]
    assert oom["ph"] == "i" and oom["args"]["step"] == 6 and "Tried to allocate" in oom["args"]["error"]
    assert oom["ts"] >= doc["tbmem"]["summary"]["steps"][-1]["ts"]


def test_an_alert_in_a_window_is_an_instant(tmp_path):
    # host RAM above 0.1% of the machine: the alert fires at the first record, step 0, inside the window
    with MemoryWriter(tmp_path, every=1, census_every=0, alerts={"host_percent": 0.1, "hysteresis": 0.05},
                      profile={"every": 10, "steps": 2, "start": 0}) as w:
        _loop(w, torch.nn.Linear(64, 64), 4)
    (entry,) = list_traces(str(tmp_path))
    doc = load_gz(trace_path(str(tmp_path), entry["name"]))
    (alert,) = [e for e in doc["traceEvents"] if e.get("name") == "memory alert"]
    assert alert["ph"] == "i" and alert["args"]["step"] == 0 and alert["args"]["kind"] == "host_percent"
    first = doc["tbmem"]["summary"]["steps"][0]
    assert first["step"] == 0 and first["ts"] <= alert["ts"] <= first["ts"] + first["dur"]
