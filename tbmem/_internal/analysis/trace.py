"""``tbmem trace RUN -o FILE.json.gz``: tbmem's tracks of any run as a Chrome trace, from the logdir alone.

No profiler is needed: the trace holds what tbmem wrote (:mod:`tbmem._internal.profile.tracks`): counter tracks of
allocated/reserved VRAM, RSS and the census's categories at every memory record, a slice per step
recorded, and instants for snapshots, out-of-memory errors, alerts and loss spikes. **Steps are the time
axis**: step ``s`` is at ``ts = s * 1000`` microseconds (one step is drawn as one millisecond), so runs
and ranks line up by step whatever their wall clocks. Each run below RUN is a process of its own
(``pid``: the rank + 1 for a job's rank folders, else the run's index + 1: Perfetto takes pid 0 for the
kernel's idle task), named after the run. A compact job (``RanksConfig(layout="compact")``) keeps runs for
rank 0 and the ranks that matter only: every rank is drawn from its rank tables (``ranks/node<n>.parquet``,
:mod:`tbmem._internal.logdir.rank_table`), with what a rank's own run adds (alerts, snapshots). A snapshot is one instant (``snapshot``, ``oom snapshot``, ...)
whatever files it was written as.
Open the file in Perfetto (ui.perfetto.dev, needs the network) or ``chrome://tracing``.

Example:
    >>> import tempfile
    >>> from tbmem import MemoryWriter
    >>> from tbmem._internal.analysis.trace import logdir_trace
    >>> run = tempfile.mkdtemp()
    >>> with MemoryWriter(run, every=1, census_every=0) as w:
    ...     _ = [w.log_memory(s) for s in range(3)]
    >>> doc = logdir_trace(run)
    >>> sorted({e["ts"] for e in doc["traceEvents"] if e["ph"] == "C"})
    [0, 1000, 2000]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
from collections import defaultdict
from typing import Any

from tbmem._internal.logdir.events import event_files, read_columns
from tbmem._internal.logdir.layout import split_rank
from tbmem._internal.logdir.rank_table import is_compact_job
from tbmem._internal.logdir.snapshots import find_snapshots
from tbmem._internal.logdir.spikes import read_spikes
from tbmem._internal.profile import tracks as tk
from tbmem._internal.tags import TAGS

__all__ = ["logdir_trace", "add_parser", "trace_command", "US_PER_STEP"]

#: One step on the time axis, in the trace's microseconds.
US_PER_STEP = 1000
_ALERTS = TAGS["alerts_text"].tag
_OOMS = TAGS["vram_ooms"].tag
EXIT_ERROR = 2


def _wanted(tag: str) -> bool:
    return tag in _FIXED or tag == _OOMS or (tag.startswith(tk.CATEGORY_PREFIX) and tag.endswith("_MB"))


_FIXED = set(tk.track_tags())


def logdir_trace(path: str | os.PathLike[str], *, on_error: str = "raise") -> dict[str, Any]:
    """The trace document of every run under ``path`` (a run folder, or a folder of runs such as a job's).

    Raises:
        tbmem._internal.logdir.errors.AnalysisError: no event files under ``path``, or a damaged one (``on_error="raise"``).
    """
    files = event_files(path)
    numbers, words = read_columns(files, on_error=on_error)
    runs = sorted({f.run for f in files})
    ranks = {run: split_rank(run)[1] for run in runs}
    by_rank = all(r is not None for r in ranks.values()) and len(set(ranks.values())) == len(runs)
    records: dict[str, dict[int, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    if by_rank and len({split_rank(run)[0] for run in runs}) == 1:
        group = split_rank(runs[0])[0]
        named = {rank: run for run, rank in ranks.items()}
        job = path if group == "." else os.path.join(path, group)
        for table_rank, steps in _table_records(job, on_error).items():
            # a rank without a run of its own is drawn as the run it would have been
            run = named.get(table_rank) or (f"rank{table_rank}" if group == "." else f"{group}/rank{table_rank}")
            if run not in ranks:
                runs.append(run)
                ranks[run] = table_rank
            for step, values in steps.items():
                records[run][step].update(values)
        runs.sort(key=lambda r: ranks[r] or 0)
    # pid 0 is the kernel's idle task in Perfetto's process model: rank r (or the run's index) is pid r + 1
    pids = {run: (rank if by_rank and (rank := ranks[run]) is not None else i) + 1 for i, run in enumerate(runs)}
    dirs = {f.run: os.path.realpath(os.path.dirname(f.path)) for f in files}
    root = os.path.realpath(os.fspath(path))
    for run, tag, step, value in zip(numbers["run"], numbers["tag"], numbers["step"], numbers["value"]):
        if _wanted(tag):
            records[run][step][tag] = value  # the last value written at a step, as TensorBoard shows
    events: list[dict[str, Any]] = []
    for run in runs:
        pid = pids[run]
        events += tk.name_events(pid, run if run != "." else os.path.basename(root))
        last_ooms = None
        for step in sorted(records[run]):
            values = records[run][step]
            ts = step * US_PER_STEP
            events += tk.counter_events(pid, ts, values)
            events.append(tk.slice_event(f"step {step}", pid, tk.TID_STEPS, ts, US_PER_STEP, args={"step": step}))
            ooms = values.get(_OOMS)
            if ooms is not None and last_ooms is not None and ooms > last_ooms:
                events.append(tk.instant_event("out of memory", pid, tk.TID_MARKS, ts,
                                               args={"step": step, "allocator_ooms": ooms}))
            last_ooms = ooms if ooms is not None else last_ooms
        seen: set[tuple[str, int]] = set()
        for snap in sorted(find_snapshots(dirs[run], root) if run in dirs else (), key=lambda s: (s.format != "json.gz", s.name)):
            if snap.step is not None and (snap.kind, snap.step) not in seen:  # one instant, whatever its files
                seen.add((snap.kind, snap.step))
                name = "snapshot" if snap.kind == "snapshot" else f"{snap.kind} snapshot"
                events.append(tk.instant_event(name, pid, tk.TID_MARKS, snap.step * US_PER_STEP,
                                               args={"step": snap.step, "file": snap.name, "kind": snap.kind}))
        for spike in read_spikes(dirs[run], root=root) if run in dirs else ():
            events.append(tk.instant_event("loss spike", pid, tk.TID_MARKS, spike["step"] * US_PER_STEP,
                                           args={"step": spike["step"], "tag": str(spike["tag"])}))
    for run, tag, step, text in zip(words["run"], words["tag"], words["step"], words["value"]):
        if tag == _ALERTS:
            events.append(tk.instant_event("memory alert", pids[run], tk.TID_MARKS, step * US_PER_STEP,
                                           args={"step": step, "text": text[:500]}))
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "tbmem": {"version": 1, "source": "logdir", "time_axis": f"step s at ts = s * {US_PER_STEP} us",
                      "processes": {str(pids[r]): r for r in runs}}}


def _table_records(path: str | os.PathLike[str], on_error: str) -> dict[int, dict[int, dict[str, float]]]:
    """``{rank: {step: {tag: value}}}`` of the tracks' tags in a compact job's rank tables (none: ``path``
    is not a compact job); a damaged table: an AnalysisError naming it, or left out (``on_error="warn"``)."""
    from tbmem._internal._extras import MissingExtraError
    from tbmem._internal.logdir.errors import AnalysisError

    job = os.fspath(path)
    if not is_compact_job(job):
        return {}
    try:
        from tbmem._internal.logdir.rank_table import rank_table_tags, read_rank_table

        mode = "raise" if on_error == "raise" else "warn"
        tags = [t for t in rank_table_tags(job, on_error=mode) if _wanted(t)]
        columns = read_rank_table(job, columns=tags, on_error=mode).to_pydict()
    except MissingExtraError as exc:
        from tbmem._internal._log import report_once

        report_once("trace:rank-table", f"tbmem trace: {exc}; the job's ranks without a run are left out")
        return {}
    except ValueError as exc:
        raise AnalysisError(str(exc)) from exc
    out: dict[int, dict[int, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    present = [(t, columns[t]) for t in tags if t in columns]
    for i, (rank, step) in enumerate(zip(columns["rank"], columns["step"])):
        values = out[rank][step]
        for tag, column in present:
            if column[i] is not None:
                values[tag] = column[i]  # rows in the order written: the last value at a step wins
    return out


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``trace`` on the ``tbmem`` command line's subparsers."""
    p = subparsers.add_parser(
        "trace", help="a run's memory tracks as a Chrome trace (Perfetto), steps on the time axis",
        description="Write tbmem's tracks of RUN (a run folder, or a job folder of rank runs) as a Chrome "
                    "trace: counters of VRAM allocated/reserved, RSS and the census's categories at every "
                    "record, a slice per step, instants for snapshots, OOMs, alerts and loss spikes. Step s "
                    f"is at s ms on the time axis; each run (rank) is a process, and every rank of a compact job "
                    f"(from its ranks/node<n>.parquet tables). Exit status: 0 ok, {EXIT_ERROR} "
                    "no runs or a damaged event file. Profile windows' own traces (with torch.profiler's "
                    "operators) are the traces/step*/rank*.pt.trace.json.gz files in the run's plugins/tbmem/.")
    p.add_argument("run", metavar="RUN", help="a run folder, or a folder of runs")
    p.add_argument("-o", "--output", required=True, metavar="FILE",
                   help="the trace to write (.json.gz: gzip'd; else plain JSON)")
    p.add_argument("--allow-truncated", action="store_true",
                   help="use the readable part of truncated or corrupt event files instead of stopping")
    p.set_defaults(func=trace_command)
    return p


def trace_command(args: argparse.Namespace) -> int:
    """Run ``tbmem trace``; returns the exit status."""
    from tbmem._internal._terminal import printable
    from tbmem._internal.logdir.errors import AnalysisError

    try:
        doc = logdir_trace(args.run, on_error="warn" if args.allow_truncated else "raise")
        text = json.dumps(doc, separators=(",", ":"), allow_nan=False).encode("utf-8")
        data = gzip.compress(text, mtime=0) if args.output.endswith(".gz") else text
        with open(args.output, "wb") as fh:
            fh.write(data)
    except AnalysisError as exc:
        print(f"tbmem trace: {printable(str(exc))}", file=sys.stderr)
        return EXIT_ERROR
    except OSError as exc:
        print(f"tbmem trace: {printable(exc.filename or args.output)}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_ERROR
    counters = sum(1 for e in doc["traceEvents"] if e["ph"] == "C")
    print(f"trace of {len(doc['tbmem']['processes'])} run(s), {counters} counter events, written to "
          f"{printable(args.output)}")
    return 0
