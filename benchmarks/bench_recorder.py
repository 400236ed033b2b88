"""The dispatch recorder's cost: a small AdamW MLP step on CPU while a snapshot window records, against
the same step with snapshots off.

Run: ``python benchmarks/bench_recorder.py`` (or ``make bench``).

One thread (``torch.set_num_threads(1)``), an MLP 256 -> 512 -> 512 -> 10 with ReLU, cross-entropy,
AdamW, batch 64. Rounds alternate: a round of steps with no recorder, then a round with a
:class:`~tbmem.snapshot.recorder.DispatchRecorder` recording (started before the round, stopped
after it, as a snapshot window does; building the snapshot afterwards is not timed), in an order
that swaps every round. The ratio is the median over rounds of (recorded round / plain round); the
spread of the per-round ratios says how stable it is. Each recorded round's snapshot is checked:
the same number of events every round and every kind of allocation of the step seen (parameters,
AdamW's two states, activations, backward, the optimizer's no_grad temporaries), with a stack for each
allocation made during
the step.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import result_line  # noqa: E402

#: Recording may make a step at most this much slower (issue 18).
LIMIT = 1.5


def measure(*, rounds: int = 15, steps: int = 20, batch: int = 64) -> tuple[float, list[float], float, int]:
    """(median ratio, per-round ratios sorted, plain ms per step, events per recorded round)."""
    import torch

    from tbmem.snapshot.recorder import DispatchRecorder

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

    def plain() -> float:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        return time.perf_counter() - t0

    rec = DispatchRecorder(models=lambda: [model], optimizers=lambda: [opt])
    events: list[int] = []

    def recorded() -> float:
        rec.start()
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        elapsed = time.perf_counter() - t0
        rec.stop()
        snap = rec.snapshot(kind="snapshot", step=0)
        assert not rec.failed, rec.failed
        assert {"parameter", "optimizer_state", "activation", "backward", "no_grad"} <= set(snap.categories), \
            snap.categories
        made = snap.allocs["start"] >= 0
        assert (snap.allocs["stack"][made] >= 0).all(), "an allocation without a stack"
        events.append(snap.n_events)
        return elapsed

    for _ in range(3):  # warm-up: AdamW's states exist, allocator caches filled
        plain()
        recorded()
    events.clear()
    ratios: list[float] = []
    plains: list[float] = []
    for r in range(rounds):
        if r % 2 == 0:
            p, q = plain(), recorded()
        else:
            q, p = recorded(), plain()
        ratios.append(q / p)
        plains.append(p)
    assert len(set(events)) == 1, f"recorded rounds differ in their events: {events}"
    return statistics.median(ratios), sorted(ratios), statistics.median(plains) / steps * 1e3, events[0]


def main() -> int:
    ratio, ratios, plain_ms, events = measure()
    print(f"AdamW MLP step, batch 64, one thread: {plain_ms:.3f} ms plain; recording a window: x{ratio:.3f} "
          f"(15 alternating rounds of 20 steps, rounds {ratios[0]:.3f}-{ratios[-1]:.3f}; {events} events per "
          f"round); load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(result_line("snapshot.dispatch_recorder_step_vs_plain", ratio, LIMIT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
