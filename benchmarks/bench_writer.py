"""MemoryWriter costs: one batched Summary vs 40 add_scalar calls, and the per-step cost of log_memory.

Run: ``python benchmarks/bench_writer.py`` (or ``make bench``).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import interleaved, result_line  # noqa: E402

from tbmem import MemoryWriter  # noqa: E402


def main() -> int:
    values = {f"Memory/bench/value_{i}_MB": float(i) for i in range(40)}
    with MemoryWriter(tempfile.mkdtemp(), census_every=0, custom_layout=False) as writer:
        step = [0]

        # Each timed call ends with a flush, so the cost of TensorBoard's writer thread
        # (serialisation, a pure-Python CRC per event) is counted, not hidden in a queue.
        def naive() -> None:
            step[0] += 1
            for tag, value in values.items():
                writer.add_scalar(tag, value, step[0])
            writer.flush()

        def batched() -> None:
            step[0] += 1
            writer.write_scalars(values, step[0])
            writer.flush()

        t_naive, t_batched = interleaved(naive, batched, repeat=100)
        print(f"40 add_scalar calls: {t_naive * 1e3:8.3f} ms | one batched Summary: {t_batched * 1e3:8.3f} ms")
        print(result_line("writer.batched_vs_naive_40_scalars", t_batched / t_naive, 0.1))

        def bare() -> None:
            step[0] += 1

        def not_due() -> None:
            step[0] += 1
            writer.log_memory(step[0] * 10 + 1)

        t_bare, t_not_due = interleaved(bare, not_due, repeat=20000)
        print(f"log_memory on a step not due: {(t_not_due - t_bare) * 1e6:.2f} us above a bare loop")

        def due() -> None:
            step[0] += 1
            writer.log_memory(step[0] * 10)

        t_naive2, t_due = interleaved(naive, due, repeat=50)
        print(f"log_memory on a due step (probes + write + flush): {t_due * 1e3:.3f} ms")
        print(result_line("writer.due_record_vs_naive_40_scalars", t_due / t_naive2))

    # The custom-scalars layout follows the tags written (tbmem.layout.LayoutTracker): once every tag
    # has been seen, each write_scalars adds one LayoutTracker.see, a set lookup per tag. Two writers
    # differ by up to 50% from each other on this machine (their writer threads), so one writer writes
    # with and without the tracker's call: the ratio is the call's share of a record of 25 readings.
    from tbmem.layout import LayoutTracker

    readings = {f"Memory/RAM/reading_{i}_GB": float(i) for i in range(25)}
    tracker = LayoutTracker()
    tracker.see(readings)
    # The write's own noise (+-8% here) would hide a 1% cost: the check is timed on its own, interleaved
    # with the write it adds to, and the ratio is (write + check) / write.
    with MemoryWriter(tempfile.mkdtemp(), census_every=0, custom_layout=False) as plain:
        t_write, t_check = interleaved(lambda: plain.write_scalars(readings, 1), lambda: tracker.see(readings),
                                       repeat=5000)
        print(f"write_scalars of 25 readings: {t_write * 1e6:.1f} us; the layout tracker's check {t_check * 1e6:.2f} us")
        print(result_line("writer.layout_tracking_vs_off", (t_write + t_check) / t_write, 1.05))

    disabled = MemoryWriter(tempfile.mkdtemp(), enabled=False)
    t_bare, t_disabled = interleaved(bare, lambda: disabled.log_memory(1), repeat=20000)
    print(f"disabled writer: {(t_disabled - t_bare) * 1e6:.2f} us per call above a bare loop")
    disabled.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
