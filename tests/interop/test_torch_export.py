"""Snapshots in PyTorch's own format: a CPU run's snapshots written beside as torch ``_snapshot()`` pickles
(``SnapshotConfig(torch_pickle=True)``) and ``tbmem snapshot export --torch``, opened by torch's own
``torch.cuda._memory_viz`` (``trace_plot``, ``segment_plot``, ``stats``), with the numbers of
``tbmem snapshot stats``."""

from __future__ import annotations

import json
import pickle
import pickletools
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.cuda import _memory_viz as memory_viz

from tbmem import MemoryWriter
from tests._shared import REAL, REAL2, require_shared

_KEYS = ("device", "reserved_bytes", "allocated_bytes", "requested_bytes", "peak_bytes", "baseline_bytes")
_NAMING = {"GLOBAL", "STACK_GLOBAL", "REDUCE", "INST", "OBJ", "NEWOBJ", "NEWOBJ_EX", "BUILD"}


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tbmem", *args], capture_output=True, text=True, timeout=300)


def _stats(path: Path) -> list[dict[str, Any]]:
    proc = _cli("snapshot", "stats", "--json", str(path))
    assert proc.returncode == 0, proc.stderr
    return [{k: d[k] for k in _KEYS} for d in json.loads(proc.stdout)["devices"]]


def _plain_pickle(path: Path) -> Any:
    """The file's pickle opcodes name no Python object, its protocol is at most 4; then torch's own reader
    (``memory_viz``'s ``_read``: ``pickle.load``) loads it."""
    data = path.read_bytes()
    ops = list(pickletools.genops(data))
    assert ops[0][0].name == "PROTO" and ops[0][1] <= 4
    assert not {op.name for op, _, _ in ops} & _NAMING
    return pickle.loads(data)  # the file this test wrote (plain data, checked above)


def _replayed_peak(doc: dict[str, Any], device: int) -> int:
    """The highest bytes alive of memory_viz's active memory timeline: allocations alive before the trace
    (freed in it without an alloc, or alive at the end without one) plus each alloc, minus each free."""
    trace = doc["device_traces"][device]
    live: set[int] = set()
    before = 0
    for e in trace:
        if e["action"] == "alloc":
            live.add(e["addr"])
        elif e["action"] == "free_completed":
            if e["addr"] in live:
                live.remove(e["addr"])
            else:  # freed, never allocated in the trace: alive when it began
                before += e["size"]
    before += sum(b["requested_size"] for s in doc["segments"] if s["device"] == device for b in s["blocks"]
                  if b["state"] != "inactive" and b["address"] not in live)
    alive = peak = before
    for e in trace:
        if e["action"] == "alloc":
            alive += e["size"]
        elif e["action"] == "free_completed":
            alive -= e["size"]
        peak = max(peak, alive)
    return peak


def _memory_viz_agrees(doc: dict[str, Any], stats: list[dict[str, Any]], devices: list[int]) -> None:
    text = memory_viz.segsum(doc)  # `python -m torch.cuda._memory_viz stats`
    reserved = sum(d["reserved_bytes"] or d["allocated_bytes"] for d in stats)
    assert f"total_reserved: {memory_viz._format_size(reserved)}\n" in text
    assert f"total_allocated: {memory_viz._format_size(sum(d['requested_bytes'] for d in stats))}\n" in text
    for page in (memory_viz.trace_plot(doc), memory_viz.segment_plot(doc)):
        assert "snapshot.pickle" in page and len(page) > 1000
    for device, d in zip(devices, stats):
        assert _replayed_peak(doc, device) == d["peak_bytes"]


def test_a_cpu_run_writes_torch_pickles_memory_viz_opens(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with MemoryWriter(tmp_path / "run", every=1, census_every=0,
                      snapshot={"steps": (2,), "html": False, "torch_pickle": True, "recorder": "dispatch"}) as w:
        for step in range(4):
            model(torch.randn(16, 32)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            w.log_memory(step)
    (gz,) = sorted((tmp_path / "run").rglob("snapshot_rank0_step*.json.gz"))
    beside = gz.with_name(gz.name[: -len(".json.gz")] + ".pickle")
    doc = _plain_pickle(beside)
    stats = _stats(gz)
    assert stats[0]["peak_bytes"] > 0 and len(doc["device_traces"]) == 1 and doc["device_traces"][0]
    _memory_viz_agrees(doc, stats, [0])
    # tbmem reads the torch form back to the same numbers; torch's format numbers devices (0) and has no
    # segment-less snapshot: each live CPU allocation is its own segment, reserved = allocated
    (back,) = _stats(beside)
    same = ("allocated_bytes", "requested_bytes", "peak_bytes", "baseline_bytes")
    assert {k: back[k] for k in same} == {k: stats[0][k] for k in same}
    assert back["reserved_bytes"] == stats[0]["allocated_bytes"] and back["device"] == "cuda:0"
    out = tmp_path / "out.pickle"
    proc = _cli("snapshot", "export", "--torch", str(gz), "-o", str(out))
    assert proc.returncode == 0 and proc.stdout.strip() == str(out), proc.stderr
    assert out.read_bytes() == beside.read_bytes()


@pytest.mark.parametrize("name", ["real/magma27_memory_snapshot.pickle", "real2/flexgen_6a8eab0_1.3b_snapshot.pickle",
                                  "real2/octreenca_752276c_my_snapshot.pickle", "real2/bcrafton_memory_snapshot.pickle"])
def test_export_of_real_gpu_snapshots_has_tbmems_numbers(name, tmp_path):
    require_shared(REAL if name.startswith("real/") else REAL2)
    src = REAL.parent / name
    out = tmp_path / "out.pickle"
    proc = _cli("snapshot", "export", "--torch", str(src), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    doc = _plain_pickle(out)
    stats = _stats(src)
    assert _stats(out) == stats
    devices = [int(d["device"].rsplit(":", 1)[1]) for d in stats]
    _memory_viz_agrees(doc, stats, devices)
