"""``tbmem trace`` of a compact job (issue 39, item 7): a real 4-rank ``torchrun`` job keeps a run for rank 0
only, yet its trace has a process per rank with its counters (drawn from the rank tables), and the tables
hold every rank's per-batch loss, as ``write_scalars`` and ``add_scalar`` wrote it, and its step time."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

pytest.importorskip("pyarrow", reason="the compact layout needs pyarrow (tbmem[ranks])")

from tbmem._internal.cli import main  # noqa: E402
from tbmem._internal.logdir.rank_table import read_rank_table  # noqa: E402
from tbmem._internal.logdir.runs import find_runs  # noqa: E402
from tests.distributed._torchrun import torchrun  # noqa: E402
from tests.interop._trace_rules import check_trace  # noqa: E402

JOB = Path(__file__).with_name("_compact_trace_job.py")
WORLD, STEPS = 4, 3


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("compact") / "job"
    proc = torchrun(WORLD, JOB, str(log_dir), str(STEPS), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    printed = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert sorted(p["rank"] for p in printed) == list(range(WORLD))
    return log_dir, {p["rank"]: p["losses"] for p in printed}


def test_trace_of_a_compact_job_has_every_rank_with_its_counters(job, tmp_path, capsys):
    log_dir, _ = job
    assert sorted(find_runs(log_dir)) == ["rank0"]  # ranks 1-3 are in the rank table only
    out = tmp_path / "job.json.gz"
    assert main(["trace", str(log_dir), "-o", str(out)]) == 0
    assert "trace of 4 run(s)" in capsys.readouterr().out
    with gzip.open(out, "rt", encoding="utf-8") as fh:
        doc = json.load(fh)
    check_trace(doc, "tbmem trace of a compact job")
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert names == {r + 1: f"rank{r}" for r in range(WORLD)}  # rank r is pid r + 1
    assert doc["tbmem"]["processes"] == {str(r + 1): f"rank{r}" for r in range(WORLD)}
    for rank in range(WORLD):
        counters = [e for e in doc["traceEvents"] if e["ph"] == "C" and e["pid"] == rank + 1]
        rss = {e["ts"]: e["args"] for e in counters if any("rss" in k.lower() for k in e["args"])}
        assert sorted(rss) == [s * 1000 for s in range(STEPS)], rank  # a counter at every record
        assert all(v > 0 and math.isfinite(v) for a in rss.values() for v in a.values())
        steps = sorted(e["args"]["step"] for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] == rank + 1)
        assert steps == list(range(STEPS)), rank


def test_rank_tables_hold_every_rank_s_loss_and_step_time_per_step(job):
    log_dir, printed = job
    rows = read_rank_table(str(log_dir), columns=["Loss/batch", "train/loss", "Perf/step_time_ms"]).to_pylist()
    for rank in range(1, WORLD):
        mine = [r for r in rows if r["rank"] == rank]
        for tag in ("Loss/batch", "train/loss"):
            got = {r["step"]: r[tag] for r in mine if r.get(tag) is not None}
            assert got == pytest.approx(dict(enumerate(printed[rank])), rel=1e-6), (rank, tag)
        times = {r["step"]: r["Perf/step_time_ms"] for r in mine if r.get("Perf/step_time_ms") is not None}
        assert sorted(times) == list(range(1, STEPS)) and all(t > 0 for t in times.values()), rank


def test_a_damaged_rank_table_stops_the_trace_or_is_left_out_with_allow_truncated(tmp_path, capsys):
    from tbmem import MemoryWriter
    from tbmem._internal.logdir.rank_table import RankTableWriter

    with MemoryWriter(tmp_path / "rank0", every=1, census_every=0) as w:
        w.log_memory(0)
    table = RankTableWriter(str(tmp_path / "ranks" / "node0.parquet"))
    table.add(1, 0, 1.0, {"Memory/RAM/process_rss_GB": 1.5})
    table.close()
    out = tmp_path / "t.json"
    assert main(["trace", str(tmp_path), "-o", str(out)]) == 0
    assert "trace of 2 run(s)" in capsys.readouterr().out
    (tmp_path / "ranks" / "node1.parquet").write_bytes(b"PAR1 not a table")
    assert main(["trace", str(tmp_path), "-o", str(out)]) == 2
    assert "node1.parquet" in capsys.readouterr().err
    assert main(["trace", str(tmp_path), "-o", str(out), "--allow-truncated"]) == 0
    assert "trace of 2 run(s)" in capsys.readouterr().out  # node0's rank 1 is still drawn
