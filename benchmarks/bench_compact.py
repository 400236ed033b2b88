"""The compact layout of large jobs (docs/distributed.md): what it costs a rank, and how fast a big job reads.

    python benchmarks/bench_compact.py [--skip-job]

1. A record on a rank above 0, compact against per-rank layout, in one process (``log_memory``
   alternately on two writers of rank 1 of 2; the compact one sends each record to its node's
   rank table, received by local rank 0's channel in another process).
   Then local rank 0's CPU per record it receives (printed, no limit).
2. ``tbmem report`` on benchmarks/synthetic_ranks.py's 1,000-rank x 1,000-record job (limit 30 s).
3. The Memory tab's first view of that job on a real ``tensorboard``: the requests the page makes
   when it opens (runs, overview, snapshots, findings excluded: it loads after the first view,
   ranks, heat map, the drill-down of the top rank), timed from the first one (limit 2 s).
4. A 32-rank ``torchrun`` job (gloo, CPU) in the compact layout: the runs TensorBoard would list and
   the groups the tab lists (tests/distributed/_compact_job.py; ``--skip-job`` leaves it out).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._common import interleaved, result_line  # noqa: E402


def bench_record() -> None:
    from tbmem import MemoryWriter

    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    logdir = tempfile.mkdtemp()
    try:
        per_rank = MemoryWriter(os.path.join(logdir, "a"), every=1, census_every=0, custom_layout=False,
                                ranks={"layout": "per_rank"})
        compact = MemoryWriter(os.path.join(logdir, "b"), every=1, census_every=0, custom_layout=False,
                               ranks={"layout": "compact"})
        # local rank 0 of the node: another process, as under torchrun
        receiver = subprocess.Popen(
            [sys.executable, "-c", "import sys; from tbmem._internal.ranks.compact import NodeChannel; ch = NodeChannel("
             "sys.argv[1], rank=0, local_rank=0, local_world=2, instance=int(sys.argv[2])); ch.close(wait_s=600); "
             "print(ch._table.rows)", os.path.join(logdir, "b"), str(compact._ranks.instance)],
            stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        steps = iter(range(10**9))
        base, cand = interleaved(lambda: per_rank.log_memory(next(steps)), lambda: compact.log_memory(next(steps)),
                                 rounds=9, repeat=200)
        compact.close()
        per_rank.close()
        rows = receiver.communicate(timeout=120)[0].strip()
        print(f"record on rank 1: per-rank {base * 1e6:.0f} us, compact {cand * 1e6:.0f} us "
              f"(local rank 0's table got {rows} rows)")
        print(result_line("compact.record_rank1_compact_vs_per_rank", cand / base, 1.05))  # unchanged (issue 31)
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


def bench_receiver(records: int = 50_000) -> None:
    """Local rank 0's CPU per record it receives (decode, table, Parquet), its receiver in a process of its own."""
    job = tempfile.mkdtemp()
    receiver = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from tbmem._internal.ranks.channel import NodeChannel; ch = NodeChannel("
         "sys.argv[1], rank=0, local_rank=0, local_world=2, instance=1); t = time.process_time(); "
         "ch.close(wait_s=600); print(ch._table.rows, time.process_time() - t)", job],
        stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    from tbmem._internal.ranks.channel import NodeChannel

    time.sleep(2)  # the receiver up
    peer = NodeChannel(job, rank=1, local_rank=1, local_world=2, instance=1)
    values = {f"Memory/reading_{i}_GB": float(i) for i in range(12)}
    for step in range(records):
        peer.send(step, values)
    peer.close()
    rows, cpu = receiver.communicate(timeout=600)[0].split()
    assert int(rows) == records, rows
    print(f"local rank 0 receiving: {float(cpu) / records * 1e6:.1f} us of CPU per record (12 tags, {rows} rows)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=120) as r:
        return r.read()


def bench_big_job() -> None:
    from benchmarks.synthetic_ranks import build

    logdir = tempfile.mkdtemp()
    start = time.perf_counter()
    build(logdir, 1000, 1000)
    print(f"synthetic 1,000 x 1,000 job built in {time.perf_counter() - start:.1f} s")
    tbmem = str(Path(sys.executable).with_name("tbmem"))
    start = time.perf_counter()
    proc = subprocess.run([tbmem, "report", logdir], capture_output=True, text=True)
    took = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "job job: 1000 ranks" in proc.stdout, proc.stdout[:2000]
    print(f"tbmem report: {took:.1f} s")
    print(result_line("compact.report_1000x1000_s_vs_30s", took / 30.0, 1.0))

    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    tb = subprocess.Popen([str(Path(sys.executable).with_name("tensorboard")), "--logdir", logdir, "--host",
                           "127.0.0.1", "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        while True:  # the server up and the run loaded: what a user waits for before opening the tab
            try:
                if "job/rank0" in json.loads(_get(f"{base}/data/runs")):
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "tensorboard did not load the job"
            time.sleep(0.5)
        plugin = f"{base}/data/plugin/tbmem"
        start = time.perf_counter()
        _get(f"{plugin}/runs")
        _get(f"{plugin}/overview?run=job/rank0&quick=1")
        _get(f"{plugin}/snapshots?run=job/rank0")
        ranks = json.loads(_get(f"{plugin}/ranks?group=job"))
        _get(f"{plugin}/heatmap?group=job")
        top = max(ranks["ranks"], key=lambda r: r["peak_vram_allocated"] or 0)["rank"]
        _get(f"{plugin}/rank_series?group=job&rank={top}")
        first = time.perf_counter() - start
        print(f"Memory tab, first view of 1,000 ranks: {first:.2f} s ({len(ranks['ranks'])} ranks, top rank {top})")
        print(result_line("compact.tab_first_view_s_vs_2s", first / 2.0, 1.0))
    finally:
        tb.terminate()
        tb.wait(timeout=30)


def bench_job32() -> None:
    from tbmem._internal.logdir.rank_table import read_rank_table
    from tbmem._internal.logdir.runs import find_runs, group_runs

    logdir = tempfile.mkdtemp()
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=32",
                           str(ROOT / "tests/distributed/_compact_job.py"), "compact", logdir, "3"],
                          env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    runs = sorted(find_runs(logdir))
    table = read_rank_table(logdir, columns=["rank", "step"]).to_pydict()
    groups = group_runs(runs)
    print(f"32-rank job in {time.perf_counter() - start:.0f} s: runs {runs}; {len(groups)} group(s) in the tab; "
          f"rank table: {len(set(table['rank']))} ranks, {len(table['rank'])} rows; files: "
          f"{sorted(os.listdir(os.path.join(logdir, 'ranks')))}")
    assert len(set(table["rank"])) == 32 and len(groups) == 1
    print(result_line("compact.job32_tensorboard_runs_vs_ranks", len(runs) / 32, 0.25))


if __name__ == "__main__":
    bench_record()
    bench_receiver()
    bench_big_job()
    if "--skip-job" not in sys.argv:
        bench_job32()
