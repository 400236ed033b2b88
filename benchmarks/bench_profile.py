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

from _common import interleaved, result_line  # noqa: E402

import torch  # noqa: E402

from tbmem import MemoryWriter  # noqa: E402

#: steps outside windows may cost at most this much more than without profiling (the issue's 0.5%). Checked on
#: the hooks' measured difference over the median step: whole steps differ by 1-3% between two identical
#: writers on this shared VM (the A/A control), more than the limit; their ratio is printed too.
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
               "control": MemoryWriter(tempfile.mkdtemp(), every=10, census_every=0, custom_layout=False),
               "profiled": MemoryWriter(tempfile.mkdtemp(), every=10, census_every=0, custom_layout=False,
                                        profile={"every": EVERY, "steps": STEPS, "start": EVERY, "max_windows": 0})}
    times: dict[str, list[tuple[int, float]]] = {k: [] for k in writers}
    # torch.profiler is process-wide: a window left open at the end of a round would profile the plain
    # writer's round too. The profiled writer's steps start half a round on, so its windows open and close
    # inside its own rounds.
    steps = {"plain": 0, "control": 0, "profiled": ROUND // 2}
    rounds: list[dict[str, list[tuple[int, float]]]] = []
    clock = time.perf_counter
    for r in range(ROUNDS):
        rounds.append({k: [] for k in writers})
        order = list(writers.items()) if r % 2 == 0 else list(writers.items())[::-1]  # ABC CBA: no order bias
        for key, w in order:
            out = rounds[-1][key]
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

    def med(key: str, rnd: dict, keep=lambda s: True) -> float:
        return statistics.median(t for s, t in rnd[key] if keep(s))

    # the median over rounds of each round's ratio of medians: a slow minute of the shared VM slows both
    ratio = statistics.median(med("profiled", rd, lambda s: not inside(s)) / med("plain", rd) for rd in rounds)
    control = statistics.median(med("control", rd) / med("plain", rd) for rd in rounds)
    for rd in rounds:
        for k in times:
            times[k] += rd[k]
    plain = statistics.median(t for _, t in times["plain"])
    window = [t for s, t in times["profiled"] if inside(s)]
    print("| steps | without profile= | with profile=, outside windows | with profile=, in windows | A/A control |")
    print("|---|---|---|---|---|")
    print(f"| median step | {plain * 1e6:.1f} us | {ratio:.4f}x | {statistics.median(window) / plain:.2f}x "
          f"({len(window)} steps) | {control:.4f}x |")
    hooks = _hooks()
    derived = (plain + hooks) / plain
    print(f"\nthe hooks outside windows (begin_step + log_memory at a step that is not due), with profile= minus "
          f"without: {hooks * 1e9:+.0f} ns per step, {100 * (derived - 1):+.4f}% of the median step")
    print(result_line("profile_outside_windows_hooks", derived, LIMIT))
    print(result_line("profile_outside_windows_steps", ratio))
    print(result_line("profile_aa_control", control))


def _hooks() -> float:
    """Seconds per step the profiled writer's hooks cost more than the plain writer's, outside windows
    (timed alone, interleaved: a whole step's noise on this VM is larger than the difference)."""
    plain = MemoryWriter(tempfile.mkdtemp(), every=10**9, census_every=0, custom_layout=False)
    prof = MemoryWriter(tempfile.mkdtemp(), every=10**9, census_every=0, custom_layout=False,
                        profile={"every": 10**8, "steps": 3, "start": 10**8})
    step = {"p": 1, "q": 1}

    def call(w: MemoryWriter, k: str) -> None:
        s = step[k]
        w.begin_step(s)
        w.log_memory(s)
        step[k] = s + 1

    base, cand = interleaved(lambda: call(plain, "p"), lambda: call(prof, "q"), rounds=21, repeat=5000)
    plain.close()
    prof.close()
    return cand - base


if __name__ == "__main__":
    main()
