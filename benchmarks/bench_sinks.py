"""A record with two extra sinks (W&B offline, MLflow on SQLite) against the TensorBoard-only record.

Run: ``python benchmarks/bench_sinks.py`` (or ``make bench``).

Two MemoryWriters in one process, one without sinks and one with ``sinks=["wandb", "mlflow"]``,
each writing a due record (probes, one event, a flush; census off) in alternating rounds for
about 10 s; the ratio is of the totals, so the sinks' batches count wherever they land. The
limit (issue 29) is on the wall time of the training thread: a sink's ``log`` only queues the
values; its thread sends them each second (``wandb.log``, MLflow's ``log_batch``), and that work,
W&B's and MLflow's own threads included, takes the GIL from the training thread at times, so it
is in the wall time measured here. Printed besides, not limited: the process's CPU time per
record (every thread of this process), and the CPU time of W&B's service process (``wandb-core``,
a child process) per record.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import result_line  # noqa: E402
from bench_writer import paired_rounds  # noqa: E402

#: A record with two extra sinks may cost at most this many times the TensorBoard-only record (issue 29).
LIMIT = 1.5
ROUNDS, REPEAT = 31, 1000


def _offline(root: str) -> None:
    os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DIR=root, WANDB_PROJECT="tbmem-bench",
                      WANDB_DATA_DIR=f"{root}/data", WANDB_CACHE_DIR=f"{root}/cache",
                      WANDB_CONFIG_DIR=f"{root}/config", MLFLOW_TRACKING_URI=f"sqlite:///{root}/mlflow.db",
                      MLFLOW_EXPERIMENT_NAME="tbmem-bench")
    from mlflow.tracking import MlflowClient

    MlflowClient().create_experiment("tbmem-bench", artifact_location=Path(root, "artifacts").as_uri())


def _children_cpu() -> float:
    import psutil

    total = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            pass
    return total


def main() -> int:
    from tbmem import MemoryWriter

    root = tempfile.mkdtemp(prefix="tbmem-bench-sinks-")
    _offline(root)
    plain = MemoryWriter(f"{root}/plain", every=1, census_every=0, custom_layout=False)
    sinks = MemoryWriter(f"{root}/sinks", every=1, census_every=0, custom_layout=False, sinks=["wandb", "mlflow"])
    steps = [0, 0]

    def tensorboard_only() -> None:
        steps[0] += 1
        plain.log_memory(steps[0])

    def with_sinks() -> None:
        steps[1] += 1
        sinks.log_memory(steps[1])

    for _ in range(50):  # warm both; the sinks' threads open their runs meanwhile
        tensorboard_only()
        with_sinks()
    child0 = _children_cpu()
    # ~10 s: each sink's thread sends about ten batches meanwhile, landing in some rounds and not in
    # others; the ratio of the totals spreads their cost over every record (a median would drop it)
    w_tb, w_sinks, c_tb, c_sinks = paired_rounds(tensorboard_only, with_sinks, rounds=ROUNDS, repeat=REPEAT)
    child_cpu = (_children_cpu() - child0) / (ROUNDS * REPEAT)
    ratios = sorted(s / t for t, s in zip(w_tb, w_sinks))
    wall, cpu = sum(w_sinks) / sum(w_tb), sum(c_sinks) / sum(c_tb)
    print(f"TensorBoard-only record:          {statistics.mean(w_tb) * 1e6:8.1f} us wall, "
          f"{statistics.mean(c_tb) * 1e6:8.1f} us CPU (this process)")
    print(f"record with W&B and MLflow sinks: {statistics.mean(w_sinks) * 1e6:8.1f} us wall, "
          f"{statistics.mean(c_sinks) * 1e6:8.1f} us CPU (this process, the sinks' threads included)")
    print(f"with sinks / TensorBoard only, {ROUNDS} alternating rounds of {REPEAT}: wall {wall:.3f} "
          f"(median of rounds {statistics.median(ratios):.3f}, rounds {ratios[0]:.3f}-{ratios[-1]:.3f}), "
          f"CPU {cpu:.3f}")
    med, cpu_med = wall, cpu
    print(f"W&B's service process (wandb-core): {child_cpu * 1e6:.1f} us CPU per record with sinks; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    opened = list(sinks._sinks.sinks) if sinks._sinks is not None else []
    plain.close()
    sinks.close()
    failed = [f"{s.name}: {s.error}" for s in opened if s.error] + (["a sink did not open"] if len(opened) != 2 else [])
    if failed:  # a sink switched off costs nothing: the ratio would be meaningless
        print("a sink failed: " + "; ".join(failed))
        return 1
    print(result_line("sinks_record_wall", med, LIMIT))
    print(result_line("sinks_record_cpu_this_process", cpu_med))
    return 0


if __name__ == "__main__":
    sys.exit(main())
