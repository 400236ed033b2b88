"""A small real snapshot in PyTorch's pickle format, made by the test: tbmem's CPU recorder records two
training steps of a small model, and the recording is written as ``torch.cuda.memory._snapshot()``
writes its dict (``segments``, ``device_traces`` of ``alloc``/``free_requested``/``free_completed``
events with their frames), pickled as ``torch.cuda.memory._dump_snapshot`` does.

The tests that need such a pickle (the Memory tab's routes, its security and browser tests) thus need
no data from outside the clone. Its peak is computed here from the written events alone (the bytes
alive before the trace, then the running sum of the trace), not by tbmem's reader.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

__all__ = ["record_torch_snapshot", "write_torch_pickle", "peak_of"]

#: torch's time_us is the Unix time in microseconds; the recording's own clock starts at 0.
_T0_US = 1_760_000_000_000_000


def record_torch_snapshot(*, origin: str = "train.py", steps: int = 2) -> dict[str, Any]:
    """``steps`` Adam steps of a small MLP on CPU, recorded by tbmem, as torch's snapshot dict.

    Args:
        origin: File name of an outermost frame added to every stack (names whose snapshot it is).
        steps: Training steps recorded.
    """
    import torch

    from tbmem._internal.snapshot.recorder import DispatchRecorder

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    rec = DispatchRecorder(max_entries=100_000, models=lambda: [model], optimizers=lambda: [opt])
    rec.start()
    try:
        for _ in range(steps):
            loss = model(torch.randn(32, 64)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        rec.stop()
    snap = rec.snapshot(kind="snapshot", step=0)
    return _torch_dict(snap, origin)


def _torch_dict(snap: Any, origin: str) -> dict[str, Any]:
    a, times = snap.allocs, snap.time_us
    outer = {"filename": origin, "line": 1, "name": "<module>"}

    def frames(stack: int) -> list[dict[str, Any]]:
        inner = [] if stack < 0 else [{"filename": f, "line": int(ln), "name": n}
                                      for f, ln, n in snap.stack_frames(stack)]
        return inner + [outer]  # innermost first, as torch writes them

    at: dict[int, list[dict[str, Any]]] = {}  # event index -> the trace entries it becomes
    blocks = []
    for i in range(len(a["size"])):
        start, end, size, addr = (int(a[k][i]) for k in ("start", "end", "size", "addr"))
        fr = frames(int(a["stack"][i]))
        if start >= 0:
            at.setdefault(start, []).append({"action": "alloc", "addr": addr, "size": size, "stream": 0,
                                             "time_us": _T0_US + int(times[start]), "frames": fr})
        if end >= 0:
            t = _T0_US + int(times[end])
            at.setdefault(end, []).extend({"action": act, "addr": addr, "size": size, "stream": 0, "time_us": t,
                                           "frames": fr} for act in ("free_requested", "free_completed"))
        else:  # alive when the snapshot is taken: a block of the segments
            blocks.append({"address": addr, "size": size, "requested_size": size, "state": "active_allocated",
                           "frames": fr})
    trace = [e for i in sorted(at) for e in at[i]]
    segments = [{"device": 0, "address": b["address"], "total_size": b["size"], "allocated_size": b["size"],
                 "active_size": b["size"], "stream": 0, "segment_type": "small", "blocks": [b]}
                for b in sorted(blocks, key=lambda b: b["address"])]
    return {"segments": segments, "device_traces": [trace]}


def peak_of(data: dict[str, Any]) -> int:
    """Peak allocated bytes of a snapshot dict made here: the segments' blocks that no traced ``alloc``
    accounts for, and blocks freed in the trace without one, were alive before it; then the running sum."""
    trace = data["device_traces"][0]
    traced = {(e["addr"], e["size"]) for e in trace if e["action"] == "alloc"}
    baseline = sum(b["size"] for s in data["segments"] for b in s["blocks"] if (b["address"], b["size"]) not in traced)
    live: set[int] = set()
    for e in trace:  # frees of blocks allocated before the trace
        if e["action"] == "alloc":
            live.add(e["addr"])
        elif e["action"] == "free_completed":
            if e["addr"] in live:
                live.discard(e["addr"])
            else:
                baseline += e["size"]
    now = peak = baseline
    for e in trace:
        now += {"alloc": e["size"], "free_completed": -e["size"]}.get(e["action"], 0)
        peak = max(peak, now)
    return peak


def write_torch_pickle(path: str | Path, *, origin: str = "train.py") -> int:
    """Record a snapshot (:func:`record_torch_snapshot`), pickle it to ``path``; return its peak bytes."""
    data = record_torch_snapshot(origin=origin)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        pickle.dump(data, fh)
    return peak_of(data)
