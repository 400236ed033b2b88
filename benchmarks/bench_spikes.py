"""The spike detector's cost: ``write_scalars`` of a batch's scalars (what the console monitors write per
batch: its loss, time and RSS) with ``spikes=True`` against the same writer without it, in alternating
rounds in one process; and the detector alone per value of a watched tag.

Run: ``python benchmarks/bench_spikes.py`` (or ``make bench``).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import interleaved, result_line  # noqa: E402

from tbmem import MemoryWriter  # noqa: E402
from tbmem._internal.spikes import SpikeConfig, SpikeDetector  # noqa: E402

#: write_scalars with the detector may cost at most this much more than without it (a write is ~15-30 us
#: here; the detector adds 1-7 us to it on this shared VM, docs/benchmarks.md).
LIMIT = 1.5


def main() -> None:
    plain = MemoryWriter(tempfile.mkdtemp(), census_every=0, custom_layout=False)
    watched = MemoryWriter(tempfile.mkdtemp(), census_every=0, custom_layout=False, spikes=True)
    steps = {"plain": 0, "watched": 0}

    def write(writer: MemoryWriter, key: str) -> None:
        steps[key] += 1
        s = steps[key]
        writer.write_scalars({"Loss/batch": 1.0 / (1 + 0.01 * s), "Perf/batch_time_s": 0.02,
                              "Monitor/batch_cpu_rss_MB": 400.0}, s)

    base, cand = interleaved(lambda: write(plain, "plain"), lambda: write(watched, "watched"), rounds=15, repeat=400)
    detector = SpikeDetector(SpikeConfig())
    n = 20_000
    start = time.perf_counter()
    for s in range(n):
        detector.update("Loss/batch", s, 1.0 / (1 + 0.01 * s))
    per_value = (time.perf_counter() - start) / n
    plain.close()
    watched.close()
    print("| write_scalars (3 scalars, one watched) | without detector | with detector | added |")
    print("|---|---|---|---|")
    print(f"| per call | {base * 1e6:.1f} us | {cand * 1e6:.1f} us | {(cand - base) * 1e6:+.1f} us |")
    print(f"\nSpikeDetector.update alone (window 50, a median per value): {per_value * 1e6:.1f} us per value")
    print(result_line("spikes_write_scalars", cand / base, LIMIT))


if __name__ == "__main__":
    main()
