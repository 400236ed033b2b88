"""Multi-rank costs: a due record with cross-rank aggregates vs without, the gather, the bytes; the
process-tree probe vs the host probe.

Run: ``python benchmarks/bench_ranks.py`` (or ``make bench``). It starts
``torchrun --standalone --nproc_per_node=N`` (gloo, CPU) for N = 2 and 4 with this file as the
worker; every rank times two writers in alternating rounds, in lockstep: one with the
aggregates (one asynchronous gather per record) and one without, a 20 ms pause (a training step)
between records. Numbers for docs/distributed.md.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from _common import interleaved, result_line  # noqa: E402

ROUNDS, REPEAT = 9, 40
GAP_S = 0.02  # a 20 ms training step between records


def _event_bytes(folder: str) -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob("events.out.tfevents.*"))


def worker(out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    from tbmem import MemoryWriter

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    plain = MemoryWriter(f"{out_dir}/plain", every=1, census_every=0, custom_layout=False,
                         ranks={"aggregate": False})
    agg = MemoryWriter(f"{out_dir}/agg", every=1, census_every=0, custom_layout=False)
    steps = {"plain": 0, "agg": 0}

    def timed(writer: MemoryWriter, key: str) -> float:
        # A training step (GAP_S, untimed) between records: the gather of a record completes in the
        # background while the next step runs, as it does in training; without the step (or without
        # the barrier), a faster rank would wait at each record for the slowest one's previous gather.
        total = 0.0
        for _ in range(REPEAT):
            time.sleep(GAP_S)
            dist.barrier()  # DDP's gradient all-reduce keeps ranks in step like this, every step
            t0 = time.perf_counter()
            writer.log_memory(steps[key])
            total += time.perf_counter() - t0
            steps[key] += 1
        return total / REPEAT

    plain_t, agg_t = [], []
    for _ in range(ROUNDS):  # alternating rounds, the same order on every rank (the gathers pair)
        plain_t.append(timed(plain, "plain"))
        agg_t.append(timed(agg, "agg"))
    t_plain, t_agg = statistics.median(plain_t), statistics.median(agg_t)
    plain.close()
    agg.close()
    records = steps["agg"]
    bytes_plain = _event_bytes(f"{out_dir}/plain/rank{rank}") / records
    bytes_agg = _event_bytes(f"{out_dir}/agg/rank{rank}") / records

    # the collective alone, blocking: what rank 0 waits for when it collects a record's gather
    group = dist.new_group(backend="gloo")
    vector = torch.zeros(8, dtype=torch.float64)
    receive = [torch.empty_like(vector) for _ in range(world)] if rank == 0 else None
    lat = []
    for _ in range(300):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        dist.gather(vector, receive, dst=0, group=group)
        lat.append(time.perf_counter() - t0)
    launch = []
    for _ in range(300):
        t0 = time.perf_counter()
        work = dist.gather(vector, receive, dst=0, group=group, async_op=True)
        launch.append(time.perf_counter() - t0)
        work.wait()
    row = {"rank": rank, "record_plain_ms": t_plain * 1e3, "record_agg_ms": t_agg * 1e3,
           "bytes_plain": bytes_plain, "bytes_agg": bytes_agg,
           "gather_blocking_us": statistics.median(lat) * 1e6, "gather_launch_us": statistics.median(launch) * 1e6}
    rows = [None] * world
    dist.all_gather_object(rows, row)
    if rank == 0:
        print("ROWS " + json.dumps(rows), flush=True)
    dist.destroy_process_group()


def _job(world: int) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=str(HERE.parent), OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as out:
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                               f"--nproc_per_node={world}", __file__, "--worker", out],
                              env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(proc.stdout[-3000:] + proc.stderr[-6000:])
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("ROWS ")]
    return json.loads(line[5:])


def _probes() -> None:
    from torch.utils.data import DataLoader

    from tbmem._internal.probes import HostProbe, ProcessTreeProbe

    loader = DataLoader(list(range(64)), batch_size=8, num_workers=2, persistent_workers=True)
    it = iter(loader)
    next(it)
    host, tree = HostProbe(), ProcessTreeProbe()
    host.start()
    t_host, t_tree = interleaved(host.read, tree.read, repeat=200)
    print(f"\nprobes, 2 DataLoader workers alive: host {t_host * 1e3:.3f} ms, process tree {t_tree * 1e3:.3f} ms")
    print(result_line("probes.process_tree_vs_host", t_tree / t_host))
    del it


def main() -> int:
    print("| ranks | rank | record without (ms) | record with aggregates (ms) | ratio | event bytes/record "
          "without | with | gather blocking (us) | gather launch (us) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for world in (2, 4):
        rows = _job(world)
        for r in rows:
            print(f"| {world} | {r['rank']} | {r['record_plain_ms']:.3f} | {r['record_agg_ms']:.3f} | "
                  f"{r['record_agg_ms'] / r['record_plain_ms']:.3f} | {r['bytes_plain']:.0f} | {r['bytes_agg']:.0f} | "
                  f"{r['gather_blocking_us']:.0f} | {r['gather_launch_us']:.0f} |")
        ratios = [r["record_agg_ms"] / r["record_plain_ms"] for r in rows]
        print(f"ranks={world}: ratio over ranks min {min(ratios):.3f} max {max(ratios):.3f}")
        print(result_line(f"ranks.record_with_aggregates_vs_without_{world}ranks", statistics.median(ratios), 2.0))
    _probes()
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
    else:
        sys.exit(main())
