"""The compact layout across two nodes: two ``torchrun`` launchers (``--nnodes=2``, one per node rank,
a static rendezvous on 127.0.0.1), 4 ranks each, one job folder (as on a shared file system).

Each node's local rank 0 receives its own node's ranks only: ``ranks/node0.parquet`` holds ranks
0-3, ``ranks/node1.parquet`` ranks 4-7, every record once; ``tbmem report`` reads one job of 8 ranks.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyarrow", reason="the compact layout needs pyarrow (tbmem[ranks])")

from tbmem._internal.logdir.rank_table import rank_table_paths, read_rank_table  # noqa: E402
from tests.distributed._torchrun import ROOT  # noqa: E402

JOB = Path(__file__).with_name("_compact_job.py")
PER_NODE, STEPS = 4, 3


def test_each_node_writes_its_own_ranks_table_and_the_report_reads_one_job(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", TMPDIR=str(tmp_path))
    env.pop("PYTHONWARNINGS", None)
    job = tmp_path / "job"
    launchers = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={node}",
         f"--nproc_per_node={PER_NODE}", "--master_addr=127.0.0.1", f"--master_port={port}",
         str(JOB), "compact", str(job), str(STEPS)],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for node in (0, 1)]
    try:
        outputs = [p.communicate(timeout=480) for p in launchers]
    finally:
        for p in launchers:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (out, err) in zip(launchers, outputs):
        assert p.returncode == 0, out[-2000:] + err[-5000:]
    assert [os.path.basename(p) for p in rank_table_paths(str(job))] == ["node0.parquet", "node1.parquet"]
    for node, path in enumerate(rank_table_paths(str(job))):
        import pyarrow.parquet as pq

        table = pq.read_table(path, columns=["rank", "step"]).to_pydict()
        pairs = list(zip(table["rank"], table["step"]))
        assert len(pairs) == len(set(pairs)), "a record twice"
        ranks = range(node * PER_NODE, (node + 1) * PER_NODE)
        assert sorted(set(table["rank"])) == list(ranks)
        # STEPS records and STEPS readings at steps 1000+ per rank
        assert sorted(pairs) == sorted((r, s) for r in ranks for s in (*range(STEPS), *range(1000, 1000 + STEPS)))
    assert sorted(set(read_rank_table(str(job), columns=[]).column("rank").to_pylist())) == list(range(2 * PER_NODE))
    proc = subprocess.run([sys.executable, "-m", "tbmem", "report", "--json", str(job)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (summary,) = json.loads(proc.stdout)["jobs"]
    assert summary["ranks"] == list(range(2 * PER_NODE)) and summary["missing"] == []
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("tbmem-rank")] == []
