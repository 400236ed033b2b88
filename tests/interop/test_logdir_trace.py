"""``tbmem trace`` of a run: what Perfetto's importer takes (tests/interop/_trace_rules.py), no process 0
(Perfetto's idle task), one instant per snapshot named by its kind."""

from __future__ import annotations

import gzip
import json

import torch

from tbmem import MemoryWriter
from tbmem._internal.cli import main
from tests.interop._trace_rules import check_trace


def test_trace_of_a_run_with_snapshots(tmp_path, capsys):
    model = torch.nn.Linear(16, 16)
    with MemoryWriter(tmp_path / "run", every=1, census_every=0,
                      snapshot={"steps": (1, 3), "recorder": "dispatch", "torch_pickle": True}) as w:
        for step in range(5):
            model(torch.randn(4, 16)).sum().backward()
            w.log_memory(step)
    out = tmp_path / "t.json.gz"
    assert main(["trace", str(tmp_path / "run"), "-o", str(out)]) == 0
    capsys.readouterr()
    with gzip.open(out, "rt", encoding="utf-8") as fh:
        doc = json.load(fh)
    check_trace(doc, "tbmem trace")
    assert {e["pid"] for e in doc["traceEvents"]} == {1}
    marks = [(e["name"], e["ts"]) for e in doc["traceEvents"] if e["ph"] == "i"]
    assert marks == [("snapshot", 1000), ("snapshot", 3000)]  # one each, though written as .json.gz, .html, .pickle
