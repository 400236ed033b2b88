"""A profile window's trace: torch.profiler's Chrome trace with tbmem's tracks merged in, on one clock.

**One clock.** torch.profiler (Kineto) stamps events with its own clock (microseconds from the trace's
``baseTimeNanoseconds``); tbmem notes times with ``time.perf_counter_ns``. At the window's start and
end tbmem opens a named profiler range (``tbmem::clock_sync``) between two ``perf_counter_ns``
readings ``before`` and ``after``; the range began (trace ``ts``) at a time between ``before`` and
``after - dur`` on tbmem's clock, so ``offset = ts - (before + after - dur) / 2`` maps tbmem's times
onto the trace with an error of at most ``(after - before - dur) / 2`` (recorded as ``uncertainty_us``;
microseconds). The sync with the smaller bound is used; the other gives the drift over the window
(``drift_us``: Kineto converts its clock to wall time, which drifts from ``perf_counter``).

What is merged: counter tracks (``"ph": "C"``) of every scalar event tbmem wrote in the window
(:mod:`tbmem.profile.tracks`: allocated/reserved, RSS, the census's categories), a slice per step
(from the end of the step before to the end of the step's ``log_memory``) and per phase (the
trainers' marks: forward, backward, optimizer; ``tbmem record`` for the record itself), instants
(out-of-memory errors, memory alerts, snapshots). The document's ``"tbmem"`` key holds the window's offline summary:
the step time split and torch.profiler's ``key_averages()`` top operators by self time and by bytes.

Example:
    >>> from tbmem.profile.merge import clock_offset
    >>> clock_offset([{"name": "tbmem::clock_sync", "ph": "X", "ts": 5000.0, "dur": 1.0}], [(1_000_000, 1_004_000)])
    {'method': 'tbmem::clock_sync range between perf_counter_ns readings', 'offset_us': 3998.5, 'uncertainty_us': 1.5, 'drift_us': None}
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from typing import Any

from tbmem.profile import tracks as tk

__all__ = ["window_trace", "clock_offset", "operator_rows", "PHASES"]

_CLOCK_EVENT = "tbmem::clock_sync"
#: The step time split's parts, in the Memory tab's order.
PHASES = ("forward", "backward", "optimizer", "data loading", "other")
_DATA_LOADING = "enumerate(DataLoader)"
_TOP = 10


def clock_offset(events: list[dict[str, Any]], syncs: list[tuple[int, int]]) -> dict[str, Any]:
    """How tbmem's ``perf_counter_ns`` times map onto the trace's ``ts`` (see the module docstring)."""
    found = sorted((e for e in events if e.get("name") == _CLOCK_EVENT and e.get("ph") == "X"),
                   key=lambda e: e["ts"])
    pairs = []
    for event, (before, after) in zip(found, syncs):
        # the range began between `before` and `after - dur` (tbmem's clock): the middle, +- half the gap
        lo, hi = before / 1000.0, max(after / 1000.0 - float(event.get("dur", 0.0)), before / 1000.0)
        pairs.append(((hi - lo) / 2, float(event["ts"]) - (lo + hi) / 2))
    if not pairs:
        raise ValueError("the profiler's trace has no tbmem::clock_sync range: cannot align the clocks")
    uncertainty, offset = min(pairs)
    drift = pairs[-1][1] - pairs[0][1] if len(pairs) > 1 else None
    return {"method": f"{_CLOCK_EVENT} range between perf_counter_ns readings", "offset_us": round(offset, 3),
            "uncertainty_us": round(uncertainty, 3), "drift_us": None if drift is None else round(drift, 3)}


def operator_rows(prof: Any) -> dict[str, list[dict[str, Any]]]:
    """The top operators of ``prof.key_averages()``: by self CPU time and by self bytes (CPU + device)."""
    rows = []
    for avg in prof.key_averages():
        cpu_b = int(getattr(avg, "self_cpu_memory_usage", 0) or 0)
        dev_b = int(getattr(avg, "self_device_memory_usage", getattr(avg, "self_cuda_memory_usage", 0)) or 0)
        rows.append({"name": avg.key, "count": int(avg.count),
                     "self_cpu_us": float(avg.self_cpu_time_total), "cpu_total_us": float(avg.cpu_time_total),
                     "self_device_us": float(getattr(avg, "self_device_time_total", 0.0) or 0.0),
                     "self_cpu_bytes": cpu_b, "self_device_bytes": dev_b, "self_bytes": cpu_b + dev_b})
    by_time = sorted(rows, key=lambda r: (-r["self_cpu_us"], r["name"]))[:_TOP]
    by_bytes = sorted((r for r in rows if r["self_bytes"] > 0), key=lambda r: (-r["self_bytes"], r["name"]))[:_TOP]
    return {"by_self_time": by_time, "by_bytes": by_bytes}


def _export(prof: Any) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tbmem-trace-") as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path, "rb") as fh:
            return json.load(fh)


def window_trace(w: Any, prof: Any, *, rank: int, config: Any) -> dict[str, Any]:
    """The merged trace document of the closed window ``w`` (a :class:`tbmem.profile.window._Window`)."""
    doc = _export(prof)
    events = doc["traceEvents"]
    clock = clock_offset(events, w.syncs)
    off = clock["offset_us"]
    pid = next(e["pid"] for e in events if e.get("name") == _CLOCK_EVENT)

    def ts(ns: int) -> float:
        return round(ns / 1000.0 + off, 3)

    out = [{"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}
           for tid, name in tk.THREAD_NAMES.items()]
    steps, prev = [], w.begins.get(w.first, w.before or w.opened)
    for step in sorted(w.records):
        entered, left = w.records[step]
        left = left or entered
        start = w.begins.get(step, prev) if step == w.first else prev
        steps.append({"step": step, "ts": ts(start), "dur": round((left - start) / 1000.0, 3)})
        out.append(tk.slice_event(f"step {step}", pid, tk.TID_STEPS, ts(start), (left - start) / 1000.0,
                                  args={"step": step}))
        out.append(tk.slice_event("tbmem record", pid, tk.TID_PHASES, ts(entered), (left - entered) / 1000.0,
                                  args={"step": step}))
        prev = left
    bounds = sorted([t for t, _, _ in w.marks] + [r[0] for r in w.records.values()])
    split = dict.fromkeys(PHASES, 0.0)
    for t, label, kind in w.marks:
        if kind != "phase":
            continue
        end = next((b for b in bounds if b > t), None)
        if end is None:
            continue
        out.append(tk.slice_event(label, pid, tk.TID_PHASES, ts(t), (end - t) / 1000.0))
        if label in split:
            split[label] += (end - t) / 1000.0
    for t, step, values in w.samples:
        out += tk.counter_events(pid, ts(t), values)
        if tk.SNAPSHOT_TAG in values:
            out.append(tk.instant_event("snapshot", pid, tk.TID_MARKS, ts(t), args={"step": step}))
    for t, name, args in w.instants:
        out.append(tk.instant_event(name, pid, tk.TID_MARKS, ts(t), args=args))
    total = sum(s["dur"] for s in steps)
    lo, hi = (steps[0]["ts"], steps[-1]["ts"] + steps[-1]["dur"]) if steps else (0.0, 0.0)
    split["data loading"] = sum(float(e.get("dur", 0.0)) for e in events if e.get("ph") == "X"
                                and str(e.get("name", "")).startswith(_DATA_LOADING) and lo <= e["ts"] <= hi)
    split["other"] = max(total - sum(v for k, v in split.items() if k != "other"), 0.0)
    summary = {"steps": steps, "total_us": round(total, 3), "split_us": {k: round(v, 3) for k, v in split.items()},
               "operators": operator_rows(prof), "tracks": _tracks(out, steps[0]["ts"] if steps else 0.0),
               "cuda": bool(w.cuda)}
    if w.external:  # PhiML's backend calls (trainers.phiml_profile), and PhiFlow's functions
        from tbmem.profile.external import field_operations, merge_external

        summary["external"] = merge_external(w.external, events, out, off)
        summary["field_operations"] = field_operations(events)
    events.extend(out)
    doc["traceName"] = f"tbmem profile window, steps {w.first}-{w.last}, rank {rank}"
    doc["tbmem"] = {"version": 1, "rank": rank, "first_step": w.first, "last_step": w.last, "clock": clock,
                    "pid": pid, "config": dataclasses.asdict(config), "summary": summary}
    return doc


def _tracks(events: list[dict[str, Any]], origin: float) -> dict[str, dict[str, list[list[float]]]]:
    """``{track: {series: [[ms from the window's first step, value], ...]}}`` of the counter events."""
    out: dict[str, dict[str, list[list[float]]]] = {}
    for e in events:
        if e["ph"] == "C":
            track = out.setdefault(e["name"], {})
            for series, value in e["args"].items():
                track.setdefault(series, []).append([round((e["ts"] - origin) / 1000.0, 3), value])
    return out
