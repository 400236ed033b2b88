"""The CPU recorder's cost: a small AdamW MLP step on CPU while a snapshot window records, against
the same step with snapshots off.

Run: ``python benchmarks/bench_recorder.py`` (or ``make bench``).

One thread (``torch.set_num_threads(1)``), an MLP 256 -> 512 -> 512 -> 10 with ReLU, cross-entropy,
AdamW, batch 64. Rounds alternate: a round of steps with no recorder, then a round with a
:class:`~tbmem._internal.snapshot.recorder.DispatchRecorder` recording (started before the round, stopped
after it, as a snapshot window does; building the snapshot afterwards is not timed), in an order
that rotates every round. The recorder runs with its default backend (the CPU allocator recorder,
:mod:`tbmem._internal.snapshot.native`; the RESULT line) and, for comparison, with the dispatch-mode backend. The ratio is the median over rounds of (recorded round / plain round); the
spread of the per-round ratios says how stable it is. Rounds are timed by the thread's CPU time
(the step runs on this one thread, so on a quiet machine that is its wall time; on a shared one it
leaves out the time the thread waited for a core); wall time is printed too.

Also measured, for scale: a ``TorchDispatchMode`` that only runs each operator (what any Python
dispatch mode costs before it records anything), the floor under the dispatch backend's design.

Each recorded round's snapshot is checked: the same number of events every round, every kind of
allocation of the step seen (parameters, AdamW's two states, activations, backward, the optimizer's
no_grad temporaries), and a stack for each allocation made during the step.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import result_line  # noqa: E402

#: Recording may make a step at most this much slower (issue 18).
LIMIT = 1.5


def measure(*, rounds: int = 21, steps: int = 20, batch: int = 64) -> dict[str, Any]:
    """Per-round ratios (CPU and wall) of recorded and pass-through rounds against plain ones."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from tbmem._internal.snapshot.recorder import DispatchRecorder

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                torch.nn.ReLU(), torch.nn.Linear(512, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(batch, 256), torch.randint(0, 10, (batch,))

    def step() -> None:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()

    def timed() -> tuple[float, float]:
        c0, w0 = time.thread_time(), time.perf_counter()
        for _ in range(steps):
            step()
        return time.thread_time() - c0, time.perf_counter() - w0

    class PassThrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            return func(*args, **(kwargs or {}))

    def passthrough() -> tuple[float, float]:
        with PassThrough():
            return timed()

    recorders = {backend: DispatchRecorder(models=lambda: [model], optimizers=lambda: [opt], backend=backend)
                 for backend in ("auto", "dispatch")}
    events: dict[str, list[int]] = {backend: [] for backend in recorders}
    used: set[str | None] = set()

    def recorded(backend: str) -> tuple[float, float]:
        rec = recorders[backend]
        rec.start()
        elapsed = timed()
        rec.stop()
        snap = rec.snapshot(kind="snapshot", step=0)
        assert not rec.failed, rec.failed
        assert {"parameter", "optimizer_state", "activation", "backward", "no_grad"} <= set(snap.categories), \
            snap.categories
        made = snap.allocs["start"] >= 0
        assert (snap.allocs["stack"][made] >= 0).all(), "an allocation without a stack"
        events[backend].append(snap.n_events)
        if backend == "auto":
            used.add(rec.backend_used)
        return elapsed

    kinds = {"plain": timed, "recorded": lambda: recorded("auto"), "dispatch": lambda: recorded("dispatch"),
             "pass-through": passthrough}
    for _ in range(3):  # warm-up: AdamW's states exist, allocator caches filled
        for fn in kinds.values():
            fn()
    for lst in events.values():
        lst.clear()
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
    order = list(kinds)
    for r in range(rounds):
        shift = r % len(order)
        for k in order[shift:] + order[:shift]:  # each kind in each position as often
            times[k].append(kinds[k]())
    for backend, lst in events.items():
        assert len(set(lst)) == 1, f"recorded rounds ({backend}) differ in their events: {lst}"

    def ratios(kind: str, which: int) -> list[float]:
        return sorted(c[which] / p[which] for c, p in zip(times[kind], times["plain"]))

    return {"cpu": ratios("recorded", 0), "wall": ratios("recorded", 1), "dispatch": ratios("dispatch", 0),
            "floor": ratios("pass-through", 0), "backend": "/".join(sorted(map(str, used))),
            "plain_ms": statistics.median(t[0] for t in times["plain"]) / steps * 1e3,
            "events": events["auto"][0], "dispatch_events": events["dispatch"][0], "rounds": rounds, "steps": steps}


def main() -> int:
    m = measure()
    med = statistics.median
    print(f"AdamW MLP step, batch 64, one thread: {m['plain_ms']:.3f} ms CPU plain; {m['rounds']} rounds of "
          f"{m['steps']} steps each, alternating; events per recorded round: {m['events']} (default backend: "
          f"{m['backend']}), {m['dispatch_events']} (dispatch backend); load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for label, key in (("recording, CPU time", "cpu"), ("recording, wall time", "wall"),
                       ("dispatch backend recording, CPU time", "dispatch"),
                       ("pass-through dispatch mode (floor), CPU time", "floor")):
        r = m[key]
        print(f"  {label:<46} x{med(r):.3f} (rounds {r[0]:.3f}-{r[-1]:.3f}, middle half "
              f"{r[len(r) // 4]:.3f}-{r[(3 * len(r)) // 4]:.3f})")
    print(result_line("snapshot.cpu_recorder_step_vs_plain", med(m["cpu"]), LIMIT))
    print(result_line("snapshot.dispatch_backend_step_vs_plain", med(m["dispatch"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
