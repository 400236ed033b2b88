"""Another profiler's events in a window's trace (PhiML's backend profiler: the PhysicalTrainer's backend
calls), moved onto the window's clock, each call with the bytes torch.profiler saw allocated in it; and
PhiFlow's field operations from torch.profiler's own Python tracer (``with_stack``), with their bytes.

The events are stamped with ``time.perf_counter`` microseconds, tbmem's own clock, so the window's clock
offset (:func:`tbmem._internal.profile.merge.clock_offset`) places them. Each source process gets a numeric id
above Linux's largest process id (:data:`EXTERNAL_PID`: ``pid_max`` is at most 2**22, so they never meet
torch.profiler's processes), named ``"PhiML calls"``, ``"PhiML backend"`` by a ``process_name`` event; every
slice carries a category (its source, ``"PhiML"``): torch-tb-profiler reads ``cat`` of every complete
event and HTA drops events whose ``pid`` is not a number. Bytes per call are the ``[memory]`` events torch.profiler
records with ``profile_memory`` whose time falls inside the call: ``allocated`` counts allocations only,
``net`` allocations minus frees (whatever thread made them: PhiML runs the loss on the main thread).

Example:
    >>> from tbmem._internal.profile.external import EXTERNAL_PID, merge_external
    >>> phiml = [{"name": "diffuse", "ph": "X", "pid": 0, "tid": 1, "ts": 100, "dur": 50}]
    >>> torch_events = [{"name": "[memory]", "ph": "i", "ts": 1120.0, "args": {"Bytes": 4096}}]
    >>> out = []
    >>> merge_external([("PhiML", phiml)], torch_events, out, 1000.0)["by_time"]
    [{'name': 'diffuse', 'count': 1, 'total_us': 50.0, 'allocated_bytes': 4096, 'net_bytes': 4096}]
    >>> out[1]["pid"] == EXTERNAL_PID, out[1]["cat"], out[1]["ts"], out[1]["args"]["tbmem allocated bytes"]
    (True, 'PhiML', 1100.0, 4096)
    >>> [e["args"]["name"] for e in out if e["ph"] == "M"]
    ['PhiML calls']
"""

from __future__ import annotations

import bisect
from typing import Any

from tbmem._internal.profile.tracks import span_us, us_of_ns

__all__ = ["merge_external", "field_operations", "PROCESS_NAMES", "EXTERNAL_PID"]

#: PhiML's process ids in its own traces, and the names they get.
PROCESS_NAMES = {0: "calls", 1: "backend"}
#: The first process id of the external sources' processes (one per source and process name).
EXTERNAL_PID = 2**22 + 1
_TOP = 10


def _bytes_in(mem: list[tuple[float, int]], times: list[float], ts: float, dur: float) -> tuple[int, int]:
    lo, hi = bisect.bisect_left(times, ts), bisect.bisect_right(times, ts + dur)
    return sum(b for _, b in mem[lo:hi] if b > 0), sum(b for _, b in mem[lo:hi])


def _memory(torch_events: list[dict[str, Any]]) -> tuple[list[tuple[float, int]], list[float]]:
    mem = sorted((float(e["ts"]), int(e.get("args", {}).get("Bytes", 0) or 0)) for e in torch_events
                 if e.get("name") == "[memory]" and isinstance(e.get("ts"), (int, float)))
    return mem, [t for t, _ in mem]


def _ranked(rows: dict[str, dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    ranked = list(rows.values())
    return {"by_time": sorted(ranked, key=lambda r: (-r["total_us"], r["name"]))[:_TOP],
            "by_bytes": sorted((r for r in ranked if r["allocated_bytes"] > 0),
                               key=lambda r: (-r["allocated_bytes"], r["name"]))[:_TOP]}


def _add(rows: dict[str, dict[str, Any]], name: str, dur: float, allocated: int, net: int) -> None:
    row = rows.setdefault(name, {"name": name, "count": 0, "total_us": 0.0, "allocated_bytes": 0, "net_bytes": 0})
    row["count"] += 1
    row["total_us"] = round(row["total_us"] + dur, 3)
    row["allocated_bytes"] += allocated
    row["net_bytes"] += net


def merge_external(external: list[tuple[str, list[dict[str, Any]]]], torch_events: list[dict[str, Any]],
                   out: list[dict[str, Any]], offset_us: float) -> dict[str, Any]:
    """Append the external events to ``out`` on the trace's clock; return the summary of their complete
    events by name (``by_time`` and ``by_bytes``: the ten that took longest and that allocated most)."""
    mem, times = _memory(torch_events)
    rows: dict[str, dict[str, Any]] = {}
    pids: dict[str, int] = {}
    for source, events in external:
        for e in events:
            e = dict(e)
            own = e.get("pid")
            name = f"{source} {PROCESS_NAMES.get(own, own) if isinstance(own, int) else own}"
            if name not in pids:
                pids[name] = EXTERNAL_PID + len(pids)
                out.append({"name": "process_name", "ph": "M", "pid": pids[name], "tid": 0, "args": {"name": name}})
            e["pid"] = pids[name]
            if not isinstance(e.get("tid"), int) or isinstance(e.get("tid"), bool):
                e["tid"] = 0
            if e.get("ph") == "M":
                if e.get("name") != "process_name":  # its own names ("1 Operations") give way to ours
                    out.append(e)
                continue
            if not isinstance(e.get("ts"), (int, float)):
                continue
            raw = float(e["ts"]) + offset_us
            e["ts"] = us_of_ns(round(raw * 1000.0))  # whole ns, as the window's own events
            if e.get("ph") == "X":  # the end rounded as a start is: back-to-back calls stay back to back
                end = round((raw + max(float(e.get("dur", 0)), 0.0)) * 1000.0)
                e["dur"] = span_us(e["ts"], us_of_ns(end))
            e["cat"] = str(e.get("cat") or source)
            if e.get("ph") == "X":
                allocated, net = _bytes_in(mem, times, e["ts"], float(e.get("dur", 0)))
                e["args"] = dict(e.get("args") or {}, **{"tbmem allocated bytes": allocated, "tbmem net bytes": net})
                _add(rows, e["name"], float(e.get("dur", 0)), allocated, net)
            out.append(e)
    return dict(_ranked(rows), source=", ".join(sorted({s for s, _ in external})))


def field_operations(torch_events: list[dict[str, Any]], prefixes: tuple[str, ...] = ("phiflow::", "phi/")
                     ) -> dict[str, Any]:
    """PhiFlow's field operations in torch.profiler's trace, by name, with the bytes allocated while each ran
    (inclusive: an operation's time and bytes hold those of the operations it called): the ranges named
    ``phiflow::<module>.<function>`` (the PhysicalTrainer's, :mod:`trainers.phiml_profile`) and, with
    ``with_stack``, the Python tracer's functions of PhiFlow's files (``phi/physics/diffuse.py(13): explicit``)."""
    mem, times = _memory(torch_events)
    rows: dict[str, dict[str, Any]] = {}
    for e in torch_events:
        name = e.get("name")
        if e.get("ph") == "X" and e.get("cat") in ("user_annotation", "python_function") \
                and isinstance(name, str) and name.startswith(prefixes):
            allocated, net = _bytes_in(mem, times, float(e["ts"]), float(e.get("dur", 0)))
            _add(rows, name, float(e.get("dur", 0)), allocated, net)
    return _ranked(rows)
