"""What the fault guards cost on a healthy disk: a guarded MemoryWriter vs the same writer without them.

The guards are a wrapper around TensorBoard's record writer in its writer thread (one
``os.stat`` per record, to cut a partly written record after a failure) and the check
around each ``add_*`` call of the MemoryWriter (closed? an OSError counted). Both writers are alive at
once and timed in alternating rounds; each call ends with a flush, so the writer
thread's work is counted.

Run: ``python benchmarks/bench_faults.py`` (or ``make bench``).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from torch.utils.tensorboard import SummaryWriter

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import result_line  # noqa: E402

import tbmem._internal.writer as writer_module  # noqa: E402
from tbmem import MemoryWriter  # noqa: E402


class _Unguarded(MemoryWriter):
    """The MemoryWriter without its guards: TensorBoard's writer thread and ``add_scalar`` unguarded."""

    def add_scalar(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        SummaryWriter.add_scalar(self, *args, **kwargs)


def main() -> int:
    guarded = MemoryWriter(tempfile.mkdtemp(), every=1, census_every=0, custom_layout=False)
    real_install = writer_module.install_safe_io
    writer_module.install_safe_io = lambda *args, **kwargs: False
    try:
        plain = _Unguarded(tempfile.mkdtemp(), every=1, census_every=0, custom_layout=False)
        control = _Unguarded(tempfile.mkdtemp(), every=1, census_every=0, custom_layout=False)  # A/A
    finally:
        writer_module.install_safe_io = real_install
    step = [0]

    def loop(w: MemoryWriter) -> None:
        step[0] += 1
        w.add_scalar("Loss/train", 0.5, step[0])  # the user's write
        w.log_memory(step[0])  # tbmem's record (every=1), flushed

    def cpu_per_step(w: MemoryWriter, repeat: int) -> float:
        start = time.process_time()
        for _ in range(repeat):
            loop(w)
        return (time.process_time() - start) / repeat

    ratios, controls = [], []
    for session in range(7):
        rounds: dict[str, list[float]] = {"plain": [], "guarded": [], "control": []}
        for _ in range(7):
            for name, w in (("plain", plain), ("guarded", guarded), ("control", control)):
                rounds[name].append(cpu_per_step(w, 100))
        t_plain, t_guarded, t_control = (statistics.median(rounds[k]) for k in ("plain", "guarded", "control"))
        ratios.append(t_guarded / t_plain)
        controls.append(t_control / t_plain)
        print(f"session {session}: unguarded {t_plain * 1e6:7.1f} | guarded {t_guarded * 1e6:7.1f} | "
              f"unguarded again {t_control * 1e6:7.1f} CPU us/step | ratio {ratios[-1]:.3f} (A/A {controls[-1]:.3f})")
    for w in (plain, guarded, control):
        w.close()
    median = statistics.median(ratios)
    print(f"ratio guarded / unguarded: median {median:.3f} over {len(ratios)} sessions "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f}); A/A control: median {statistics.median(controls):.3f} "
          f"(min {min(controls):.3f}, max {max(controls):.3f})")
    print(result_line("faults.guarded_vs_unguarded_step", median, 1.1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
