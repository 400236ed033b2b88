"""One damaged node table of a compact job: `tbmem report` names it, leaves its ranks out and reads the rest."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("pyarrow", reason="the rank table needs pyarrow (tbmem[ranks])")

from tbmem import MemoryWriter
from tbmem._internal.logdir.rank_table import RankTableWriter, rank_table_path
from tests.faults._child import REPO, child_env


def test_report_names_the_damaged_node_table_and_reads_the_others(tmp_path):
    job = tmp_path / "logs" / "job"
    with MemoryWriter(job / "rank0", every=1, census_every=0, custom_layout=False) as w:
        for step in range(3):
            w.log_memory(step)
    for node, ranks in (("0", (0, 1)), ("1", (2, 3))):
        table = RankTableWriter(rank_table_path(str(job), node))
        for rank in ranks:
            for step in range(3):
                table.add(rank, step, 0.0, {"Memory/RAM/process_rss_GB": 1.0 + rank})
        table.close()
    damaged = rank_table_path(str(job), "1")
    with open(damaged, "r+b") as fh:  # its footer overwritten: "Parquet magic bytes not found"
        fh.seek(-8, 2)
        fh.write(b"\0" * 8)
    done = subprocess.run([sys.executable, "-m", "tbmem", "report", str(tmp_path / "logs")], check=False,
                          capture_output=True, text=True, timeout=180, env=child_env(), cwd=str(REPO))
    assert done.returncode == 0, done.stderr
    assert "node1.parquet" in done.stderr and "left out" in done.stderr
    assert "job job: 2 ranks" in done.stdout  # ranks 0 and 1, from node0.parquet
