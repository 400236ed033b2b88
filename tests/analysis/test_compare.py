"""`tbmem compare` on the issue's acceptance example (tests/_compare_runs.py: the heat and Burgers physical
models, the SyntheticTrainer at two widths): every number of its JSON and of its table equals the value read
back from the event files with TensorBoard's own loader, every difference is the later run minus the first;
runs of the same steps align by step; the figure is written; errors are one line."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from tbmem._internal.analysis.table import format_value
from tbmem._internal.cli import main
from tests._events import read_events

RUNS = ["heat", "burgers", "unet_f8", "unet_f16"]
CENSUS = "Memory/Tensor_Category/"


def _run(capsys, *argv):
    code = main(["compare", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def _events(path):
    """tag -> {step: value} of one run, read with TensorBoard's EventAccumulator (not tbmem's loader)."""
    acc = read_events(path)
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def _expected(ev, section, metric, point_steps):
    """The value a row must show for one run, from the run's events alone."""
    def top(*tags):
        values = [v for t in tags for v in ev.get(t, {}).values()]
        return max(values) if values else None

    memory_steps = sorted({s for t, d in ev.items() if t.startswith("Memory/") for s in d})
    times = np.array([ev["Perf/step_time_ms"][s] for s in sorted(ev.get("Perf/step_time_ms", {}))], dtype=float)
    durations = ev.get("Perf/census_duration_ms", {})
    simple = {
        "steps": f"{memory_steps[0]}..{memory_steps[-1]}", "records": float(len(memory_steps)),
        "peak VRAM allocated": top("Memory/GPU/vram_peak_allocated_GB", "Memory/GPU/vram_allocated_GB"),
        "peak RAM RSS": top("Memory/RAM/process_peak_rss_GB", "Memory/RAM/process_rss_GB"),
        "peak process tree RSS": top("Memory/RAM/process_tree_rss_GB"),
        "step time mean": times.mean() if len(times) else None,
        "step time median": float(np.median(times)) if len(times) else None,
        "step time p95": float(np.percentile(times, 95)) if len(times) else None,
        "step time max": times.max() if len(times) else None,
        "censuses": float(len(durations)) if durations else None,
        "census median": float(np.median(list(durations.values()))) if durations else None,
        "iterations": float(len(ev["Loss/iteration"])) if "Loss/iteration" in ev else None,
        "loss evaluations": float(len(ev["Loss/evaluation"])) if "Loss/evaluation" in ev else None,
    }
    if metric == "census share of the run":
        if not durations:
            return None
        st = ev["Perf/step_time_ms"]
        steps = sorted(st)
        elapsed = sum(st[b] * (b - a) for a, b in zip(steps, steps[1:]))
        inside = sum(v for s, v in durations.items() if steps[0] < s <= steps[-1])
        return 100 * inside / elapsed
    if not section.startswith("census at"):
        return simple[metric]
    step = point_steps[section.removeprefix("census at ")]
    if step is None:
        return None
    if metric == "step":
        return str(step)
    tag = {"total": "Memory/Tensor_Census/total_MB"}.get(metric)
    if tag is None and metric.startswith(("module ", "dtype ")):
        kind, name = metric.split(" ", 1)
        tag = f"Memory/Tensor_{'Module' if kind == 'module' else 'DType'}/{name}_MB"
    tag = tag or f"{CENSUS}{metric}_MB"
    return ev.get(tag, {}).get(step, 0.0)  # a census logs no tag for a dtype it did not find: 0 there


def _phase_steps(ev):
    """Each aligned point's census step of one run: nearest to start/middle/end of its census steps."""
    steps = sorted({s for t, d in ev.items() if t.startswith(CENSUS) for s in d})
    if not steps:
        return {"start": None, "middle": None, "end": None}
    near = lambda target: min(steps, key=lambda s: (abs(s - target), s))  # noqa: E731
    return {n: near(steps[0] + f * (steps[-1] - steps[0])) for n, f in (("start", 0), ("middle", .5), ("end", 1))}


def test_every_number_equals_the_event_files(compare_logdir, capsys):
    paths = [compare_logdir / r for r in RUNS]
    code, out, err = _run(capsys, *paths, "--json")
    assert code == 0 and err == ""
    doc = json.loads(out)
    assert [r["run"] for r in doc["runs"]] == RUNS and doc["align"] == "phase"  # 8, 6, 18, 18 records
    events = {r: _events(compare_logdir / r) for r in RUNS}
    steps = {r: _phase_steps(events[r]) for r in RUNS}
    assert [{r: p["steps"][r] for r in RUNS} for p in doc["points"]] == [
        {r: steps[r][n] for r in RUNS} for n in ("start", "middle", "end")]
    metrics = {(row["section"], row["metric"]) for row in doc["rows"]}
    for needed in [("memory", "peak RAM RSS"), ("speed", "step time mean"), ("speed", "census median"),
                   ("L-BFGS-B", "iterations"), ("census at end", "parameters"), ("census at end", "dtype float32")]:
        assert needed in metrics, needed
    assert any(m.startswith("module ") for _, m in metrics)
    checked = 0
    for row in doc["rows"]:
        for run, value in zip(RUNS, row["values"]):
            want = _expected(events[run], row["section"], row["metric"], steps[run])
            if isinstance(want, str) or want is None:
                assert value == want, (row, run)
            else:
                assert value == pytest.approx(want, rel=1e-9, abs=1e-12), (row, run)
                checked += 1
        for value, diff in zip(row["values"][1:], row["diffs"]):
            a = row["values"][0]
            assert diff == (None if row["kind"] == "text" or a is None or value is None else pytest.approx(value - a))
    assert checked > 100
    # the physical runs have no census; the two widths differ in parameters by 4x (filters 8 -> 16)
    params = next(r for r in doc["rows"] if r["section"] == "census at end" and r["metric"] == "parameters")
    assert params["values"][:2] == [None, None] and params["values"][3] > 3.5 * params["values"][2]

    # the table shows the same numbers, formatted as `tbmem report` formats them
    code, text, _ = _run(capsys, *paths)
    legend, table = text.split("\n\n", 1)
    assert legend.splitlines()[:4] == [f"{lab}  {r}" for lab, r in zip("ABCD", RUNS)]
    lines = table.splitlines()
    assert lines[0].split() == ["metric", "A", "B", "C", "D", "B-A", "C-A", "D-A"]
    section = None
    rows = {(r["section"], r["metric"]): r for r in doc["rows"]}
    for line in lines[2:]:
        if not line.startswith("  "):
            section = line.strip()
            continue
        metric, *cells = re.split(r"\s{2,}", line.strip())
        row = rows[(section, metric)]
        shown = [format_value(v, row["kind"]) for v in row["values"]]
        assert cells[:4] == shown, (section, metric)
        for cell, diff in zip(cells[4:], row["diffs"]):
            assert cell.lstrip("+") == format_value(diff, row["kind"]).lstrip("+")


def test_runs_of_the_same_steps_align_by_step_and_the_figure_is_written(compare_logdir, capsys, tmp_path):
    png = tmp_path / "c.png"
    code, out, err = _run(capsys, compare_logdir / "unet_f8", compare_logdir / "unet_f16", "--json", "--png", png)
    doc = json.loads(out)
    assert code == 0 and doc["align"] == "step" and png.stat().st_size > 20_000
    for p in doc["points"]:
        assert p["steps"]["unet_f8"] == p["steps"]["unet_f16"]
    code, out, _ = _run(capsys, compare_logdir / "heat", compare_logdir / "burgers", "--align", "step")
    assert code == 0 and "aligned by step" in out  # no census in either: nothing to align but the rows


@pytest.mark.parametrize("argv, message", [
    (["/nonexistent/a", "/nonexistent/b"], "does not exist"),
    (["{root}/heat"], "name two or more runs"),
    (["{root}", "{root}/heat"], "holds 4 runs"),
    (["{root}/heat", "{root}/heat"], "a run is named twice"),
])
def test_errors_are_one_line(compare_logdir, capsys, argv, message):
    code, out, err = _run(capsys, *[a.format(root=compare_logdir) for a in argv])
    assert code == 2 and out == "" and message in err and len(err.strip().splitlines()) == 1
