"""Both trainers' profile windows read by the tools users already run: torch-tb-profiler's loader and
parser, Holistic Trace Analysis pointed at a window's folder, and the trace-event rules Perfetto's importer
applies (tests/interop/_trace_rules.py); every window and every slice counted."""

from __future__ import annotations

import gzip
import json
import logging
import os
import warnings
from pathlib import Path
from typing import Any

import pytest

from tbmem._internal.logdir.traces import list_traces, trace_path
from tests.interop._trace_rules import check_trace, violations
from trainers.experiment import run_experiment

pytest.importorskip("torch_tb_profiler")
pytest.importorskip("hta")

SYNTHETIC = ("burgers_quick_test", "trainer=synthetic_with_memory", "trainer_params.epochs=2",
             "tbmem.census_every=50", "tbmem.profile={every: 4, steps: 2, start: 4, max_windows: 2}")
PHYSICAL = ("burgers_physical_quick_test", "trainer=physical_with_memory",
            "tbmem.profile={every: 2, steps: 2, start: 2, max_windows: 2}")


@pytest.fixture(scope="module", params=[SYNTHETIC, PHYSICAL], ids=["synthetic", "physical"])
def windows(request, compose_once, tmp_path_factory) -> list[tuple[Path, dict[str, Any]]]:
    """The run's windows: (trace path, document)."""
    cfg = compose_once(*request.param)
    out = run_experiment(cfg, log_dir=tmp_path_factory.mktemp("trainer") / "run")
    found = [Path(trace_path(str(out.log_dir), t["name"])) for t in list_traces(str(out.log_dir))]
    assert len(found) == 2
    docs = []
    for path in found:
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            docs.append((path, json.load(fh)))
    return docs


def _window_steps(doc: dict[str, Any]) -> list[int]:
    return [s["step"] for s in doc["tbmem"]["summary"]["steps"]]


def test_every_trace_follows_the_trace_event_rules(windows):
    for path, doc in windows:
        check_trace(doc, str(path))
        # tbmem's slices: each step's ProfilerStep#N holds its "step N" slice exactly
        steps = {e["name"]: e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "user_annotation"
                 and str(e.get("name")).startswith("ProfilerStep#")}
        assert sorted(steps) == [f"ProfilerStep#{s}" for s in _window_steps(doc)]
    # and the validator refuses what Perfetto drops
    doc = {"traceEvents": [
        {"name": "forward", "ph": "X", "ts": 10.0, "dur": 5.0011, "pid": 1, "tid": 2, "cat": "tbmem"},
        {"name": "outer", "ph": "X", "ts": 9.0, "dur": 6.0, "pid": 1, "tid": 2, "cat": "tbmem"},
        {"name": "call", "ph": "X", "ts": 1.0, "dur": 1.0, "pid": "PhiML backend", "tid": 1},
        {"name": "c", "ph": "C", "ts": 1.0, "pid": 1, "tid": 0, "args": {"x": float("nan")}}]}
    problems = violations(doc)
    assert any("'forward'" in p and "overlaps 'outer'" in p for p in problems)
    assert any("not integers" in p for p in problems) and any("no cat" in p for p in problems)
    assert any("counter args" in p for p in problems)


def test_torch_tb_profiler_parses_every_window(windows, tmp_path):
    from torch_tb_profiler.profiler.data import RunProfileData
    from torch_tb_profiler.profiler.run_generator import RunGenerator
    from torch_tb_profiler.profiler.trace import EventTypes

    for path, doc in windows:
        # torch-tb-profiler's loader: a worker per file of a run folder, named before .pt.trace.json.gz
        from torch_tb_profiler import consts

        assert consts.WORKER_PATTERN.match(path.name).group(1) == "rank0"
        data = RunProfileData.parse("rank0", None, str(path), str(tmp_path))
        profile = RunGenerator("rank0", None, data).generate_run_profile()
        assert profile is not None
        assert data.steps_names == [str(s) for s in _window_steps(doc)]  # its steps are the window's
        assert data.distributed_info["rank"] == 0 and data.distributed_info["world_size"] == 1
        ops = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "operator")]
        assert ops and sum(1 for e in data.events if e.type == EventTypes.OPERATOR) == len(ops)
        memory = [e for e in doc["traceEvents"] if e.get("ph") == "i" and e.get("name") == "[memory]"]
        assert sum(1 for e in data.events if e.type == EventTypes.MEMORY) == len(memory)


def _hta(folder: Path) -> Any:
    from hta.trace_analysis import TraceAnalysis

    with warnings.catch_warnings():
        # HTA 0.5's own use of pandas (reset_index(inplace=True), ...), not tbmem's
        warnings.filterwarnings("ignore", message="The inplace keyword in")
        analysis = TraceAnalysis(trace_dir=str(folder), include_last_profiler_step=True)
        return analysis, [int(s) for s in analysis.get_profiler_steps()]


def test_hta_reads_every_window_folder_with_its_rank_and_steps(windows, caplog):
    for path, doc in windows:
        folder = path.parent
        assert os.listdir(folder) == ["rank0.pt.trace.json.gz"]  # nothing else: no snapshot .json.gz
        with caplog.at_level(logging.WARNING):
            caplog.clear()
            analysis, steps = _hta(folder)
        assert not [r for r in caplog.records if "does not have the rank" in r.getMessage()]  # found it
        assert list(analysis.t.traces) == [0]
        assert steps == _window_steps(doc)
        # every slice up to the end of the last step (HTA keeps what the traced steps hold)
        ends = [e["ts"] + e["dur"] for e in doc["traceEvents"] if str(e.get("name")).startswith("ProfilerStep#")]
        slices = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e["ts"] <= max(ends)]
        assert len(analysis.t.traces[0]) == len(slices)
        names = {analysis.t.symbol_table.sym_table[i] for i in analysis.t.traces[0]["name"].unique()}
        external = {e["name"] for e in slices if e.get("cat") == "PhiML"}
        assert external <= names  # PhiML's backend calls are there (numeric pids)
