"""Another profiler's events in a window's trace (PhiML's backend profiler: the PhysicalTrainer's backend
calls), moved onto the window's clock, each call with the bytes torch.profiler saw allocated in it; and
PhiFlow's field operations from torch.profiler's own Python tracer (``with_stack``), with their bytes.

The events are stamped with ``time.perf_counter`` microseconds, tbmem's own clock, so the window's clock
offset (:func:`tbmem.profile.merge.clock_offset`) places them. Their processes keep their own ids as
strings (``"PhiML calls"``, ``"PhiML backend"``): Perfetto and ``chrome://tracing`` take string ids, and
they never meet torch.profiler's numbers. Bytes per call are the ``[memory]`` events torch.profiler
records with ``profile_memory`` whose time falls inside the call: ``allocated`` counts allocations only,
``net`` allocations minus frees (whatever thread made them: PhiML runs the loss on the main thread).

Example:
    >>> from tbmem.profile.external import merge_external
    >>> phiml = [{"name": "diffuse", "ph": "X", "pid": 0, "tid": 1, "ts": 100, "dur": 50}]
    >>> torch_events = [{"name": "[memory]", "ph": "i", "ts": 1120.0, "args": {"Bytes": 4096}}]
    >>> out = []
    >>> merge_external([("PhiML", phiml)], torch_events, out, 1000.0)["by_time"]
    [{'name': 'diffuse', 'count': 1, 'total_us': 50.0, 'allocated_bytes': 4096, 'net_bytes': 4096}]
    >>> out[0]["pid"], out[0]["ts"], out[0]["args"]["tbmem allocated bytes"]
    ('PhiML calls', 1100.0, 4096)
"""

from __future__ import annotations

import bisect
from typing import Any

__all__ = ["merge_external", "field_operations", "PROCESS_NAMES"]

#: PhiML's process ids in its own traces, and the names they get.
PROCESS_NAMES = {0: "calls", 1: "backend"}
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
    named: set[Any] = set()
    for source, events in external:
        for e in events:
            e = dict(e)
            raw_pid = e.get("pid")
            pid = f"{source} {PROCESS_NAMES.get(raw_pid, raw_pid) if isinstance(raw_pid, int) else raw_pid}"
            e["pid"] = pid
            if e.get("ph") == "M":
                if e.get("name") == "process_name":
                    if pid in named:
                        continue
                    named.add(pid)
                    e["args"] = {"name": pid}
                out.append(e)
                continue
            if not isinstance(e.get("ts"), (int, float)):
                continue
            e["ts"] = round(float(e["ts"]) + offset_us, 3)
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
