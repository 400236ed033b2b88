"""Checks shared by the profile tests: the trace-event format and the trace against the event files."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

from tests._events import read_events
from tbmem._internal.profile.tracks import CATEGORY_PREFIX, CATEGORY_TRACK, TRACKS

__all__ = ["load_gz", "check_spec", "counters_match_events", "step_of"]

_PHASES = {"X", "B", "E", "i", "I", "C", "M", "s", "t", "f", "b", "e", "n"}


def load_gz(path: Path) -> dict[str, Any]:
    """``json.load`` after gzip, as a user would open the file."""
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return json.load(fh)


def check_spec(doc: dict[str, Any]) -> None:
    """The Trace Event Format (JSON object form) as Perfetto's importer reads it: ``traceEvents`` a list;
    each event a dict with ``ph``, ``pid`` and ``tid`` (integers or strings); ``ts`` (microseconds) a finite number except
    on metadata; ``X`` with ``dur`` >= 0; ``C`` with ``args`` of finite numbers; ``i`` with scope g/p/t;
    ``M`` naming a process or thread."""
    assert isinstance(doc, dict) and isinstance(doc["traceEvents"], list) and doc["traceEvents"]
    for e in doc["traceEvents"]:
        ph = e.get("ph")
        assert ph in _PHASES, e
        # integers, or strings (torch.profiler's own "Spans" process is named so; Perfetto takes both)
        assert isinstance(e.get("pid"), (int, str)) and isinstance(e.get("tid"), (int, str)), e
        if ph != "M":
            assert isinstance(e.get("ts"), (int, float)) and math.isfinite(e["ts"]), e
        if ph == "X":
            assert isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0, e
        if ph == "C":
            assert isinstance(e.get("name"), str) and e["args"], e
            assert all(isinstance(v, (int, float)) and math.isfinite(v) for v in e["args"].values()), e
        if ph == "i":
            assert e.get("s", "t") in ("g", "p", "t"), e
        if ph == "M" and e["name"] in ("process_name", "thread_name"):
            assert isinstance(e["args"]["name"], str), e


def step_of(ts: float, steps: list[dict[str, Any]]) -> int:
    """The step whose slice holds ``ts``; before the first slice: the step before (the record that opened
    the window)."""
    for s in steps:
        if s["ts"] <= ts <= s["ts"] + s["dur"]:
            return s["step"]
    assert ts < steps[0]["ts"], (ts, steps)
    return steps[0]["step"] - 1


def counters_match_events(doc: dict[str, Any], run_dir: Path) -> int:
    """Every tbmem counter value of the trace equals the event files' value of its tag at the step whose
    slice holds it (event files keep float32: rel 1e-6). Returns how many values were compared."""
    acc = read_events(run_dir)
    tags = set(acc.Tags()["scalars"])
    steps = doc["tbmem"]["summary"]["steps"]
    compared = 0
    for e in doc["traceEvents"]:
        if e.get("ph") != "C" or e.get("cat") != "tbmem":
            continue
        step = step_of(e["ts"], steps)
        for series, value in e["args"].items():
            tag = (CATEGORY_PREFIX + series + "_MB") if e["name"] == CATEGORY_TRACK else TRACKS[e["name"]][series]
            assert tag in tags, tag
            logged = {ev.step: ev.value for ev in acc.Scalars(tag)}
            assert step in logged, (tag, step, sorted(logged))
            assert math.isclose(value, logged[step], rel_tol=1e-6), (tag, step, value, logged[step])
            compared += 1
    return compared
