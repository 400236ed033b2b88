"""A strict check of the trace-event rules Perfetto's JSON importer applies (it cannot run here).

Perfetto reads ``ts`` and ``dur`` in microseconds and keeps them as integer nanoseconds; on one thread
(``pid``, ``tid``) complete slices (``"ph": "X"``) must nest perfectly: a slice that starts inside another
must end inside it (Perfetto before v57.1 drops the slice that breaks the rule, without a word; later
versions truncate it). :func:`violations` lists every breach of these rules, each as one line:

- ``traceEvents`` is a list of objects, each with a known ``ph``;
- ``pid`` and ``tid`` are integers (not strings, not booleans);
- every slice has a non-empty string ``cat`` and ``name``, a finite ``ts`` and a finite ``dur`` >= 0;
- counters have ``args`` of finite numbers; instants a scope of ``g``/``p``/``t``;
- on each thread, slices nest perfectly, both in integer nanoseconds and in the floating-point values
  themselves (``ts + dur`` of a slice never passes the end of the slice it started in);
- metadata names a process or thread with a string.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

__all__ = ["violations", "check_trace", "slices_by_thread"]

_PHASES = {"X", "B", "E", "i", "I", "C", "M", "s", "t", "f", "b", "e", "n", "P", "O", "N", "D", "R"}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _llround(x: float) -> int:
    """C's ``llround`` (Perfetto's rounding) of a float, halves away from zero."""
    whole = math.floor(x)
    return whole + (1 if x - whole >= 0.5 else 0)


def slices_by_thread(doc: dict[str, Any]) -> dict[tuple[Any, Any], list[dict[str, Any]]]:
    """The complete slices of each (pid, tid)."""
    out: dict[tuple[Any, Any], list[dict[str, Any]]] = defaultdict(list)
    for e in doc.get("traceEvents", []):
        if isinstance(e, dict) and e.get("ph") == "X":
            out[(e.get("pid"), e.get("tid"))].append(e)
    return out


def _nesting(thread: tuple[Any, Any], slices: list[dict[str, Any]]) -> list[str]:
    """Perfect nesting on one thread: in integer ns as Perfetto reads them (rounded since v47, truncated
    before), and in the floats themselves."""
    problems = []
    ok = [e for e in slices if _finite(e.get("ts")) and _finite(e.get("dur"))]
    for to_ns, how in ((_llround, "rounded"), (math.trunc, "truncated")):
        # as an importer sorts: by start, the longer (the parent) first
        ok.sort(key=lambda e: (to_ns(e["ts"] * 1000), -to_ns(e["dur"] * 1000)))
        stack: list[tuple[int, float, dict[str, Any]]] = []  # (end ns, end us, event)
        for e in ok:
            start_ns = to_ns(e["ts"] * 1000)
            end_ns, end_us = start_ns + to_ns(e["dur"] * 1000), e["ts"] + e["dur"]
            while stack and stack[-1][0] <= start_ns:
                stack.pop()
            if stack and (end_ns > stack[-1][0] or end_us > stack[-1][1]):
                parent = stack[-1][2]
                problems.append(f"thread {thread} ({how} ns): {e.get('name')!r} [{e['ts']!r}, +{e['dur']!r}] "
                                f"overlaps {parent.get('name')!r} [{parent['ts']!r}, +{parent['dur']!r}]")
                continue  # dropped, as Perfetto drops it
            stack.append((end_ns, end_us, e))
    return problems


def violations(doc: Any) -> list[str]:
    """Every breach of the rules (see the module docstring); [] for a trace Perfetto takes whole."""
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        return ["not a JSON object with a traceEvents list"]
    out = []
    for i, e in enumerate(doc["traceEvents"]):
        if not isinstance(e, dict):
            out.append(f"event {i} is not an object")
            continue
        ph = e.get("ph")
        where = f"event {i} ({e.get('name')!r}, ph {ph!r})"
        if ph not in _PHASES:
            out.append(f"{where}: unknown ph")
            continue
        if not _is_int(e.get("pid")) or not _is_int(e.get("tid")):
            out.append(f"{where}: pid {e.get('pid')!r} / tid {e.get('tid')!r} not integers")
        if ph != "M" and not _finite(e.get("ts")):
            out.append(f"{where}: ts {e.get('ts')!r} not a finite number")
        if ph == "X":
            if not isinstance(e.get("cat"), str) or not e["cat"]:
                out.append(f"{where}: no cat")
            if not isinstance(e.get("name"), str) or not e["name"]:
                out.append(f"{where}: no name")
            if not _finite(e.get("dur")) or e["dur"] < 0:
                out.append(f"{where}: dur {e.get('dur')!r} not a finite number >= 0")
        elif ph == "C":
            args = e.get("args")
            if not isinstance(args, dict) or not args or not all(_finite(v) for v in args.values()):
                out.append(f"{where}: counter args {args!r} not finite numbers")
        elif ph in ("i", "I"):
            if e.get("s", "t") not in ("g", "p", "t"):
                out.append(f"{where}: instant scope {e.get('s')!r}")
        elif ph == "M" and e.get("name") in ("process_name", "thread_name") \
                and not isinstance((e.get("args") or {}).get("name"), str):
            out.append(f"{where}: metadata without a string name")
    for thread, slices in slices_by_thread(doc).items():
        out += _nesting(thread, slices)
    return out


def check_trace(doc: Any, what: str = "trace") -> None:
    """Fail with every breach listed (the first 20) unless the trace follows every rule."""
    problems = violations(doc)
    assert not problems, f"{what}: {len(problems)} breach(es) of the trace-event rules:\n" + "\n".join(problems[:20])
