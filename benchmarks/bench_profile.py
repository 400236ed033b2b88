"""Profile windows cost nothing outside them: a small training step with ``log_memory`` and ``begin_step`` at
every step, under a writer with ``profile=`` (windows of 3 steps every 200) against the same loop under a
writer without it, in alternating rounds in one process. The ratio compares the median step time of the
profiled writer's steps outside its windows (the step before a window opens it, so it counts as inside)
with the plain writer's; the steps inside windows are shown too (what torch.profiler costs there).
torch.profiler is process-wide, so each window opens and closes inside the profiled writer's round.

Run: ``python benchmarks/bench_profile.py`` (or ``make bench``).
"""

from __future__ import annotations

import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import result_line  # noqa: E402

import torch  # noqa: E402

from tbmem import MemoryWriter  # noqa: E402

#: steps outside windows may cost at most this much more than without profiling (the issue's 0.5%)
LIMIT = 1.005
EVERY, STEPS, ROUND, ROUNDS = 400, 3, 400, 20


def main() -> None:
    logging.getLogger("tbmem").setLevel(logging.ERROR)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, 128)
    writers = {"plain": MemoryWriter(tempfile.mkdtemp(), every=10, census_every=0, custom_layout=False),
               "profiled": MemoryWriter(tempfile.mkdtemp(), every=10, census_every=0, custom_layout=False,
                                        profile={"every": EVERY, "steps": STEPS, "start": EVERY, "max_windows": 0})}
    times: dict[str, list[tuple[int, float]]] = {k: [] for k in writers}
    # torch.profiler is process-wide: a window left open at the end of a round would profile the plain
    # writer's round too. The profiled writer's steps start half a round on, so its windows open and close
    # inside its own rounds.
    steps = {"plain": 0, "profiled": ROUND // 2}
    clock = time.perf_counter
    for _ in range(ROUNDS):
        for key, w in writers.items():
            out = times[key]
            for _ in range(ROUND):
                s = steps[key]
                t0 = clock()
                w.begin_step(s)
                loss = model(x).pow(2).mean()
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                w.log_memory(s)
                out.append((s, clock() - t0))
                steps[key] = s + 1
    for w in writers.values():
        w.close()

    def inside(s: int) -> bool:
        start = (s + 1) // EVERY * EVERY if (s + 1) % EVERY == 0 else s // EVERY * EVERY
        return start >= EVERY and start - 1 <= s < start + STEPS

    plain = statistics.median(t for _, t in times["plain"])
    outside = statistics.median(t for s, t in times["profiled"] if not inside(s))
    window = [t for s, t in times["profiled"] if inside(s)]
    ratio = outside / plain
    print("| steps | without profile= | with profile=, outside windows | with profile=, in windows |")
    print("|---|---|---|---|")
    print(f"| median step | {plain * 1e6:.1f} us | {outside * 1e6:.1f} us ({ratio:.4f}x) | "
          f"{statistics.median(window) * 1e6:.1f} us ({statistics.median(window) / plain:.2f}x, {len(window)} steps) |")
    print(result_line("profile_outside_windows", ratio, LIMIT))


if __name__ == "__main__":
    main()
