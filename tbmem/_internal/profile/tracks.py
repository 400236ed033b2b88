"""tbmem's own tracks as Chrome trace events (torch-free): memory counters, step and phase slices, instants.

Shared by a profile window (:mod:`tbmem._internal.profile.window`, which merges them into torch.profiler's
trace) and ``tbmem trace`` (:mod:`tbmem._internal.analysis.trace`, from a logdir alone). Every event follows
the trace-event format: ``ph`` (``"C"`` counter, ``"X"`` complete slice, ``"i"`` instant, ``"M"``
metadata), ``ts`` and ``dur`` in microseconds, ``pid`` and ``tid``; a counter's ``args`` are its
series, numbers only. Counter values are the scalars the run wrote, in their tags' units (GB and MB
are 2**30 and 2**20 bytes, as :data:`tbmem.TAGS` says), unchanged: a trace never disagrees with
the event files.

Example:
    >>> from tbmem._internal.profile.tracks import counter_events
    >>> [e["name"] for e in counter_events(1, 10.0, {"Memory/RAM/process_rss_GB": 1.5, "Loss/batch": 3.0})]
    ['tbmem RAM (GiB)']
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

from tbmem._internal.tags import TAGS

__all__ = ["TRACKS", "CATEGORY_PREFIX", "CATEGORY_TRACK", "SNAPSHOT_TAG", "TID_STEPS", "TID_PHASES", "TID_MARKS",
           "THREAD_NAMES", "counter_events", "slice_event", "instant_event", "name_events", "track_tags", "span_us",
           "us_of_ns"]

#: counter track -> {series: tag}: the readings of a memory record, one track per unit.
TRACKS: dict[str, dict[str, str]] = {
    "tbmem VRAM (GiB)": {"allocated": TAGS["vram_allocated"].tag, "reserved": TAGS["vram_reserved"].tag},
    "tbmem RAM (GiB)": {"rss": TAGS["ram_rss"].tag},
}
#: The census's categories (parameters, gradients, optimizer state, activations, ...): one track.
CATEGORY_PREFIX = TAGS["census_category"].tag.split("{", 1)[0]
CATEGORY_TRACK = "tbmem tensor categories (MiB)"
#: Written with every snapshot saved (tbmem._internal.snapshot.manager): an instant in the trace.
SNAPSHOT_TAG = TAGS["snapshot_events"].tag
#: tbmem's threads in a process of the trace: integers (the trace-event format's ids) above Linux's largest
#: thread id (``pid_max`` is at most 2**22), so they never meet torch.profiler's threads; named by :func:`name_events`.
TID_STEPS, TID_PHASES, TID_MARKS = 2**22 + 1, 2**22 + 2, 2**22 + 3
THREAD_NAMES = {TID_STEPS: "tbmem steps", TID_PHASES: "tbmem phases", TID_MARKS: "tbmem events"}


def us_of_ns(ns: int) -> float:
    """``ns`` nanoseconds as the trace's microseconds (the nearest float).

    Example:
        >>> us_of_ns(1500)
        1.5
    """
    return ns / 1000.0


def _llround(x: float) -> int:
    """C's ``llround`` of a positive float (halves away from zero), exactly."""
    whole = math.floor(x)
    return whole + (1 if x - whole >= 0.5 else 0)


def _fits(ts: float, dur: float, end: float) -> bool:
    """Whether the slice ``[ts, ts + dur]`` ends by ``end`` as floats and in the integer nanoseconds an importer
    makes of each number on its own: rounded (Perfetto since v47) or truncated (before)."""
    if ts + dur > end:
        return False
    return all(conv(ts * 1000.0) + conv(dur * 1000.0) <= conv(end * 1000.0) for conv in (_llround, math.trunc))


def span_us(ts: float, end: float) -> float:
    """The ``dur`` of a slice from ``ts`` to ``end`` (us): ``end - ts``, a nanosecond or two shorter where
    the float sum ``ts + dur`` or an importer's integer nanoseconds of ``ts`` and ``dur`` would pass ``end``
    (at Kineto's magnitudes, 10**12 us, a float holds a microsecond to about 1 ns). A slice so never
    overlaps the one that starts where it ends: the format allows perfect nesting only.

    Example:
        >>> ts, end = 5302516280269.217, 5302516280892.396
        >>> dur = span_us(ts, end)
        >>> ts + dur <= end, round(dur, 2)
        (True, 623.18)
    """
    dur = max(round(end - ts, 3), 0.0)
    if dur > 0.0 and not _fits(ts, dur, end):
        dur = max(end - ts, 0.0)
    for _ in range(4):
        if dur <= 0.0 or _fits(ts, dur, end):
            break
        dur = max(dur - 0.001, 0.0)
    return dur


def track_tags() -> dict[str, str]:
    """``{tag: "track/series"}`` of the fixed tracks (the category track takes any tag under its prefix)."""
    return {tag: f"{track}/{series}" for track, series_tags in TRACKS.items() for series, tag in series_tags.items()}


def counter_events(pid: Any, ts: float, values: Mapping[str, float]) -> list[dict[str, Any]]:
    """Counter events (``"ph": "C"``) at ``ts`` us for the memory tags among ``values`` (one event written);
    a value that is not finite is left out (the format takes numbers only)."""
    out = []
    for track, series_tags in TRACKS.items():
        args = {series: float(values[tag]) for series, tag in series_tags.items()
                if tag in values and math.isfinite(values[tag])}
        if args:
            out.append({"name": track, "ph": "C", "ts": ts, "pid": pid, "tid": 0, "cat": "tbmem", "args": args})
    cats = {tag[len(CATEGORY_PREFIX):-len("_MB")]: float(v) for tag, v in values.items()
            if tag.startswith(CATEGORY_PREFIX) and tag.endswith("_MB") and math.isfinite(v)}
    if cats:
        out.append({"name": CATEGORY_TRACK, "ph": "C", "ts": ts, "pid": pid, "tid": 0, "cat": "tbmem",
                    "args": cats})
    return out


def slice_event(name: str, pid: Any, tid: Any, ts: float, dur: float, *, cat: str = "tbmem",
                args: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A complete slice (``"ph": "X"``) from ``ts`` for ``dur`` us."""
    event = {"name": name, "ph": "X", "ts": ts, "dur": max(dur, 0.0), "pid": pid, "tid": tid, "cat": cat}
    if args:
        event["args"] = dict(args)
    return event


def instant_event(name: str, pid: Any, tid: Any, ts: float, *, args: Mapping[str, Any] | None = None,
                  cat: str = "tbmem") -> dict[str, Any]:
    """An instant (``"ph": "i"``, process scope) at ``ts`` us."""
    event = {"name": name, "ph": "i", "s": "p", "ts": ts, "pid": pid, "tid": tid, "cat": cat}
    if args:
        event["args"] = dict(args)
    return event


def name_events(pid: Any, process: str, threads: Iterable[Any] = (TID_STEPS, TID_PHASES, TID_MARKS)
                ) -> list[dict[str, Any]]:
    """Metadata events (``"ph": "M"``) naming a process and tbmem's threads in it."""
    out = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": process}}]
    out += [{"name": "thread_name", "ph": "M", "pid": pid, "tid": t, "args": {"name": THREAD_NAMES.get(t, str(t))}}
            for t in threads]
    return out
