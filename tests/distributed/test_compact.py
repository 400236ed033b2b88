"""The compact layout of a job (docs/distributed.md): real ``torchrun --standalone`` jobs of 8 ranks.

The same script runs twice, per rank and compact: TensorBoard lists rank 0 (the job's aggregates)
and the ranks that matter only (rank 5 holds the peak RSS, rank 3 fired an alert); the node's
Parquet rank table holds every rank's records, the same steps and tags as the per-rank job's
event files, the same values where the script wrote values that depend on rank and step only.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("pyarrow", reason="the compact layout needs pyarrow (tbmem[ranks])")

from tbmem._internal.logdir.rank_table import rank_table_paths, read_rank_table  # noqa: E402
from tbmem._internal.logdir.runs import find_runs  # noqa: E402
from tests._events import read_events  # noqa: E402
from tests.distributed._torchrun import torchrun  # noqa: E402

JOB = Path(__file__).with_name("_compact_job.py")
WORLD, STEPS = 8, 4


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    base = tmp_path_factory.mktemp("layouts")
    staging = base / "tmp"
    staging.mkdir()
    old = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(staging)  # the ranks' private run folders: all must be gone after the job
    try:
        out = {}
        for layout in ("compact", "per_rank"):
            proc = torchrun(WORLD, JOB, layout, str(base / layout), str(STEPS), timeout=480)
            assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
            out[layout] = base / layout
            out[layout + "_stdout"] = proc.stdout
    finally:
        if old is None:
            os.environ.pop("TMPDIR")
        else:
            os.environ["TMPDIR"] = old
    out["staging"] = staging
    return out


def test_compact_job_has_runs_for_rank0_and_the_ranks_that_matter_only(jobs):
    assert sorted(find_runs(jobs["compact"])) == ["rank0", "rank3", "rank5"]  # the job, an alert, the peak RSS
    assert sorted(find_runs(jobs["per_rank"])) == [f"rank{r}" for r in range(WORLD)]
    assert [p.name for p in jobs["staging"].iterdir() if p.name.startswith("tbmem-rank")] == []
    assert [os.path.basename(p) for p in rank_table_paths(str(jobs["compact"]))] == ["node0.parquet"]
    assert rank_table_paths(str(jobs["per_rank"])) == []


def _event_rows(run: Path) -> dict[tuple[int, str], float]:
    acc = read_events(run)
    # every scalar but rank 0's cross-rank aggregates (derived, in its run only)
    return {(e.step, tag): e.value for tag in acc.Tags()["scalars"] if not tag.startswith("Ranks/")
            for e in acc.Scalars(tag)}


def test_rank_table_holds_every_rank_s_records_as_the_per_rank_layout_writes_them(jobs):
    table = read_rank_table(str(jobs["compact"])).to_pylist()
    rows: dict[int, dict[tuple[int, str], float]] = {}
    for record in table:
        rank, step = record.pop("rank"), record.pop("step")
        assert record.pop("wall_time") > 1.7e9
        for tag, value in record.items():
            if value is not None:
                assert (step, tag) not in rows.setdefault(rank, {}), "a record twice in the table"
                rows[rank][(step, tag)] = value
    assert sorted(rows) == list(range(WORLD))
    for rank in range(WORLD):
        per_rank = _event_rows(jobs["per_rank"] / f"rank{rank}")
        assert set(rows[rank]) == set(per_rank), rank  # the same records: steps and tags
        fixed = {k: v for k, v in per_rank.items() if k[0] >= 1000}  # the values that depend on rank and step
        assert len(fixed) == 2 * STEPS
        assert {k: rows[rank][k] for k in fixed} == pytest.approx(fixed, rel=1e-6)
    # and the kept runs' event files hold what the table holds for them
    for rank in (3, 5):
        kept = _event_rows(jobs["compact"] / f"rank{rank}")
        assert kept == pytest.approx(rows[rank], rel=1e-6)


def test_tensorboard_lists_the_job_and_the_chosen_ranks_only(jobs, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = Path(sys.executable).with_name("tensorboard")
    log = tmp_path / "tensorboard.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen([str(exe), "--logdir", str(jobs["compact"]), "--host", "127.0.0.1", "--port",
                                 str(port), "--load_fast", "false", "--reload_interval", "1"],
                                stdout=sink, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        runs: list[str] = []
        while len(runs) < 3:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/runs", timeout=5) as response:
                    runs = json.loads(response.read())
            except OSError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, log.read_text()[-3000:]
            time.sleep(0.5)
        time.sleep(2)  # another reload: nothing more appears
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/runs", timeout=5) as response:
            assert sorted(json.loads(response.read())) == ["rank0", "rank3", "rank5"]
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_report_reads_every_rank_of_a_compact_job_from_its_rank_table(jobs):
    from tbmem._internal.analysis.rank_table import table_summaries
    from tbmem._internal.analysis.summary import summarize

    proc = subprocess.run([sys.executable, "-m", "tbmem", "report", "--json", str(jobs["compact"])],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (job,) = json.loads(proc.stdout)["jobs"]
    assert job["ranks"] == list(range(WORLD)) and job["missing"] == []
    rss = next(m for m in job["imbalance"] if m["name"] == "peak_rss_gb")
    # the readings written at steps 1000+: rank r's RSS is (r + 1) GB + step MB
    assert (rss["max_rank"], rss["min_rank"]) == (7, 0)
    assert rss["max"] == pytest.approx(8 + (STEPS - 1) / 1024) and len(rss["values"]) == WORLD
    # the table's summary of a rank equals its event files' where the rank kept its run
    from_table = {s.run: s for s in table_summaries(str(jobs["compact"]), ".")}
    from_events = {s.run: s for s in summarize(str(jobs["compact"]))}
    assert sorted(from_events) == ["rank0", "rank3", "rank5"]
    for run, ev in from_events.items():
        tb = from_table[run]
        for field in ("records", "first_step", "last_step", "peak_rss_gb", "peak_tree_rss_gb", "max_tree_workers"):
            assert getattr(tb, field) == pytest.approx(getattr(ev, field), rel=1e-6), (run, field)
        assert tb.step_time_ms["mean"] == pytest.approx(ev.step_time_ms["mean"], rel=1e-6)
        assert tb.step_time_ms["max"] == pytest.approx(ev.step_time_ms["max"], rel=1e-6)
