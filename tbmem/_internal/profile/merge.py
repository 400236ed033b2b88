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
(:mod:`tbmem._internal.profile.tracks`: allocated/reserved, RSS, the census's categories), a slice per step
(from the end of the step before to the end of the step's ``log_memory``) and per phase (the
trainers' marks: forward, backward, optimizer; ``tbmem record`` for the record itself), instants
(out-of-memory errors, memory alerts, snapshots). The document's ``"tbmem"`` key holds the window's offline summary:
the step time split and torch.profiler's ``key_averages()`` top operators by self time and by bytes.

Example:
    >>> from tbmem._internal.profile.merge import clock_offset
    >>> clock_offset([{"name": "tbmem::clock_sync", "ph": "X", "ts": 5000.0, "dur": 1.0}], [(1_000_000, 1_004_000)])
    {'method': 'tbmem::clock_sync range between perf_counter_ns readings', 'offset_us': 3998.5, 'uncertainty_us': 1.5, 'drift_us': None}
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from typing import Any

from tbmem._internal.profile import tracks as tk

__all__ = ["window_trace", "clock_offset", "operator_rows", "PHASES", "PROFILER_STEP", "numeric_ids", "NAMED_ID"]

_CLOCK_EVENT = "tbmem::clock_sync"
#: The name torch.profiler's schedule gives each step's range (``ProfilerStep#<step>``).
PROFILER_STEP = "ProfilerStep#"
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


def window_trace(w: Any, prof: Any, *, rank: int, config: Any, world_size: int | None = 1) -> dict[str, Any]:
    """The merged trace document of the closed window ``w`` (a :class:`tbmem._internal.profile.window._Window`);
    its ``distributedInfo`` says ``rank`` and ``world_size`` (torch.profiler writes it only for a
    process group it sees; ``world_size`` None: left out, not known)."""
    doc = _export(prof)
    events = doc["traceEvents"]
    clock = clock_offset(events, w.syncs)
    off = clock["offset_us"]
    pid = next(e["pid"] for e in events if e.get("name") == _CLOCK_EVENT)

    def ts(ns: int) -> float:  # whole nanoseconds on the trace's clock: both ends of a slice round alike
        return tk.us_of_ns(round(ns + off * 1000.0))

    out = [{"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}
           for tid, name in tk.THREAD_NAMES.items()]
    steps, prev = [], w.begins.get(w.first, w.before or w.opened)
    for step in sorted(w.records):
        entered, left = w.records[step]
        left = left or entered
        start = w.begins.get(step, prev) if step == w.first else prev
        steps.append({"step": step, "ts": ts(start), "dur": tk.span_us(ts(start), ts(left))})
        # the range torch.profiler's own schedule writes (HTA's iterations, torch-tb-profiler's steps)
        out.append(tk.slice_event(f"{PROFILER_STEP}{step}", pid, tk.TID_STEPS, ts(start),
                                  tk.span_us(ts(start), ts(left)), cat="user_annotation"))
        out.append(tk.slice_event(f"step {step}", pid, tk.TID_STEPS, ts(start), tk.span_us(ts(start), ts(left)),
                                  args={"step": step}))
        out.append(tk.slice_event("tbmem record", pid, tk.TID_PHASES, ts(entered), tk.span_us(ts(entered), ts(left)),
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
        out.append(tk.slice_event(label, pid, tk.TID_PHASES, ts(t), tk.span_us(ts(t), ts(end))))
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
        from tbmem._internal.profile.external import field_operations, merge_external

        summary["external"] = merge_external(w.external, events, out, off)
        summary["field_operations"] = field_operations(events)
    events.extend(out)
    numeric_ids(events)
    doc["traceName"] = f"tbmem profile window, steps {w.first}-{w.last}, rank {rank}"
    info = dict(doc.get("distributedInfo") or {}, rank=rank)
    if world_size is not None:
        info["world_size"] = world_size
    doc["distributedInfo"] = info
    doc["tbmem"] = {"version": 1, "rank": rank, "first_step": w.first, "last_step": w.last, "clock": clock,
                    "pid": pid, "config": dataclasses.asdict(config), "summary": summary}
    return doc


#: The first id given to a process or thread torch.profiler names with a string ("Spans", "Traces").
NAMED_ID = 2**23


def numeric_ids(events: list[dict[str, Any]]) -> None:
    """Give every process and thread named by a string (torch.profiler's ``"Spans"`` and ``"Traces"``) a
    number from :data:`NAMED_ID` on, named by a metadata event as it was: HTA drops events whose ids are
    not numbers, and the trace-event format has numbers. In place.

    Example:
        >>> ev = [{"name": "x", "ph": "X", "ts": 1.0, "dur": 1.0, "pid": "Spans", "tid": "PyTorch Profiler"}]
        >>> numeric_ids(ev)
        >>> ev[0]["pid"] == NAMED_ID, [e["args"]["name"] for e in ev[1:]]
        (True, ['Spans', 'PyTorch Profiler'])
    """
    pids: dict[Any, int] = {}
    tids: dict[tuple[Any, Any], int] = {}
    named = {(e.get("pid"), e.get("tid") if e.get("name") == "thread_name" else None)
             for e in events if e.get("ph") == "M" and e.get("name") in ("process_name", "thread_name")}

    extra = []
    for e in events:
        pid, tid = e.get("pid"), e.get("tid")
        if not isinstance(pid, int) or isinstance(pid, bool):
            if pid not in pids:
                pids[pid] = NAMED_ID + len(pids)
                if (pid, None) not in named:
                    extra.append({"name": "process_name", "ph": "M", "pid": pids[pid], "tid": 0,
                                  "args": {"name": str(pid) or "unnamed"}})
            e["pid"] = pids[pid]
        if not isinstance(tid, int) or isinstance(tid, bool):
            if (pid, tid) not in tids:
                tids[(pid, tid)] = NAMED_ID + len(tids)
                if (pid, tid) not in named:
                    extra.append({"name": "thread_name", "ph": "M", "pid": e["pid"], "tid": tids[(pid, tid)],
                                  "args": {"name": str(tid) or "unnamed"}})
            e["tid"] = tids[(pid, tid)]
    events.extend(extra)


def _tracks(events: list[dict[str, Any]], origin: float) -> dict[str, dict[str, list[list[float]]]]:
    """``{track: {series: [[ms from the window's first step, value], ...]}}`` of the counter events."""
    out: dict[str, dict[str, list[list[float]]]] = {}
    for e in events:
        if e["ph"] == "C":
            track = out.setdefault(e["name"], {})
            for series, value in e["args"].items():
                track.setdefault(series, []).append([round((e["ts"] - origin) / 1000.0, 3), value])
    return out
