"""Two jobs writing one node's rank table (one logdir, the same job folder): no row group lost, both
jobs' columns kept; what a writer killed mid-flush left is removed by the next one."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("pyarrow", reason="the rank table needs pyarrow (tbmem[ranks])")

from tbmem._internal.logdir.rank_table import RankTableWriter, read_rank_table
from tests.faults._child import finish, start_child

GROUPS = 40

_JOB = """
import sys
from tbmem._internal.logdir.rank_table import RankTableWriter
path, rank, tag = sys.argv[1], int(sys.argv[2]), sys.argv[3]
table = RankTableWriter(path)
for step in range(%d):
    table.add(rank, step, 0.0, {tag: float(step)})
    table.flush()  # a row group each: the read-rewrite-rename of the whole file, as the receiver does
print("done")
""" % GROUPS


def test_two_jobs_at_once_lose_no_row_group(tmp_path):
    path = str(tmp_path / "job" / "ranks" / "node0.parquet")
    jobs = [start_child(_JOB, path, str(rank), f"Memory/Job{rank}/x_GB") for rank in (0, 1)]
    for job in jobs:
        out, err = finish(job, timeout=240)
        assert out.strip() == "done", err
    table = read_rank_table(str(tmp_path / "job")).to_pydict()
    for rank in (0, 1):
        steps = [s for r, s in zip(table["rank"], table["step"]) if r == rank]
        assert sorted(steps) == list(range(GROUPS)), f"rank {rank}: {GROUPS - len(steps)} row groups lost"
        values = [v for r, v in zip(table["rank"], table[f"Memory/Job{rank}/x_GB"]) if r == rank]
        assert sorted(values) == [float(s) for s in range(GROUPS)]


def test_a_later_job_keeps_the_earlier_job_s_columns(tmp_path):
    path = str(tmp_path / "job" / "ranks" / "node0.parquet")
    first = RankTableWriter(path)
    first.add(0, 1, 0.0, {"Memory/A_GB": 1.0})
    first.close()
    second = RankTableWriter(path)
    second.add(1, 2, 0.0, {"Memory/B_GB": 2.0})
    second.close()
    table = read_rank_table(str(tmp_path / "job")).to_pydict()
    assert table["rank"] == [0, 1]
    assert table["Memory/A_GB"] == [1.0, None] and table["Memory/B_GB"] == [None, 2.0]


def test_the_part_a_killed_writer_left_is_removed_by_the_next_flush(tmp_path):
    path = str(tmp_path / "job" / "ranks" / "node0.parquet")
    code = f"""
import os, signal
from tbmem._internal.logdir import rank_table
table = rank_table.RankTableWriter({path!r})
table.add(0, 1, 0.0, {{"Memory/A_GB": 1.0}})
table.flush()
real = rank_table.os.replace
def killed(src, dst):  # killed between writing the new file and renaming it over the table
    os.kill(os.getpid(), signal.SIGKILL)
rank_table.os.replace = killed
table.add(0, 2, 0.0, {{"Memory/A_GB": 2.0}})
table.flush()
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ))
    assert proc.returncode == -9, proc.stderr
    folder = tmp_path / "job" / "ranks"
    assert [n for n in os.listdir(folder) if n.endswith(".part")], "the killed writer left no part to sweep"
    later = RankTableWriter(path)
    later.add(1, 3, 0.0, {"Memory/A_GB": 3.0})
    later.close()
    assert not [n for n in os.listdir(folder) if n.endswith(".part")]
    assert read_rank_table(str(tmp_path / "job")).to_pydict()["step"] == [1, 3]
