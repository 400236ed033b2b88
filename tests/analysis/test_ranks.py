"""Rank folders in the analysis: one row per rank, the imbalance, and the extremes of large jobs."""

from __future__ import annotations

import json

import pytest

from tbmem.analysis import rank_jobs, summarize
from tbmem._internal.analysis.ranks import split_rank_run
from tbmem._internal.cli import main
from tests.analysis._logdirs import write_run

RSS = "Memory/RAM/process_rss_GB"
TREE = "Memory/RAM/process_tree_rss_GB"


@pytest.fixture
def job(tmp_path):
    # rank 1 holds the most host memory, rank 2's DataLoader workers the most below it
    for rank, (rss, tree, ms) in enumerate([(1.0, 1.5, 20.0), (2.0, 2.25, 24.0), (1.5, 3.0, 22.0)]):
        write_run(tmp_path / "exp" / "run1" / f"rank{rank}", range(0, 100, 10),
                  lambda s, rss=rss, tree=tree, ms=ms: {RSS: rss, TREE: tree, "Perf/step_time_ms": ms})
    write_run(tmp_path / "single", range(0, 100, 10), lambda s: {RSS: 0.5})
    return tmp_path


def test_split_rank_run():
    assert split_rank_run("exp/run1/rank12") == ("exp/run1", 12)
    assert split_rank_run("rank0") == (".", 0)
    assert split_rank_run("exp/ranking") is None and split_rank_run("exp/rank1/tb") is None


def test_rank_jobs_compute_the_imbalance(job):
    (j,) = rank_jobs(summarize(job))
    assert (j.job, j.ranks, j.missing) == ("exp/run1", [0, 1, 2], [])
    rss, tree, step = j.metric("peak_rss_gb"), j.metric("peak_tree_rss_gb"), j.metric("step_time_mean_ms")
    assert (rss.max, rss.max_rank, rss.min, rss.min_rank, rss.mean) == (2.0, 1, 1.0, 0, 1.5)
    assert rss.spread_percent == pytest.approx(100 * (2.0 - 1.0) / 1.5)
    assert (tree.max_rank, tree.values) == (2, {0: 1.5, 1: 2.25, 2: 3.0})
    assert step.max == 24.0 and step.max_rank == 1
    assert j.metric("peak_allocated_gb") is None  # a CPU job: no VRAM row


def test_report_prints_one_row_per_rank_and_the_imbalance(job, capsys):
    assert main(["report", str(job)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["metric", "single"]  # rank folders are not columns
    assert "job exp/run1: 3 ranks" in out
    rows = {ln.split()[0]: ln.split() for ln in out.splitlines() if ln[:1].isdigit()}
    assert rows["1"][:6] == ["1", "10", "2.00", "GiB", "2.25", "GiB"] and rows["2"][4:6] == ["3.00", "GiB"]
    imbalance = [ln for ln in out.splitlines() if ln.startswith("peak RAM RSS") and "rank" in ln]
    assert imbalance == ["peak RAM RSS           2.00 GiB (rank 1)  1.00 GiB (rank 0)  1.50 GiB   66.7%"]
    assert "step time mean            24 ms (rank 1)     20 ms (rank 0)     22 ms   18.2%" in out  # as a run's


def test_a_job_and_a_run_show_memory_in_the_same_units(tmp_path, capsys):
    # a run and a rank holding 0.374 GB each: the table of runs said "383 MiB", the job's rows "0.374"
    write_run(tmp_path / "single", range(0, 30, 10), lambda s: {RSS: 0.374, "Perf/step_time_ms": 35.31})
    for rank, rss in enumerate([0.374, 0.0625]):
        write_run(tmp_path / "job" / f"rank{rank}", range(0, 30, 10),
                  lambda s, rss=rss: {RSS: rss, "Perf/step_time_ms": 35.31})
    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    run_cell = next(ln for ln in out.splitlines() if ln.startswith("peak RAM RSS")).split()[-2:]
    assert run_cell == ["383", "MiB"]
    rows = {ln.split()[0]: ln for ln in out.splitlines() if ln[:1].isdigit()}
    assert rows["0"].split()[2:6] == ["383", "MiB", "35.3", "ms"] and rows["1"].split()[2:4] == ["64.0", "MiB"]
    assert "peak RAM RSS (GB)" not in out and "(ms)" not in out
    imbalance = next(ln for ln in out.splitlines() if ln.startswith("peak RAM RSS") and "(rank 0)" in ln)
    assert imbalance.split()[3:] == ["383", "MiB", "(rank", "0)", "64.0", "MiB", "(rank", "1)", "223", "MiB", "142.7%"]


def test_report_json_has_the_jobs(job, capsys):
    assert main(["report", str(job), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (j,) = doc["jobs"]
    tree = next(m for m in j["imbalance"] if m["name"] == "peak_tree_rss_gb")
    assert tree["max_rank"] == 2 and tree["values"] == {"0": 1.5, "1": 2.25, "2": 3.0}
    assert sorted(r["run"] for r in doc["runs"]) == ["exp/run1/rank0", "exp/run1/rank1", "exp/run1/rank2", "single"]


def test_large_jobs_show_the_extremes_unless_asked(tmp_path, capsys):
    for rank in range(24):
        write_run(tmp_path / f"rank{rank}", [0, 10], lambda s, r=rank: {RSS: 1.0 + r / 64})
    (tmp_path / "rank30").mkdir()  # a rank folder without event files: that rank wrote nothing
    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    ranks = [int(ln.split()[0]) for ln in out.splitlines() if ln[:1].isdigit()]
    assert ranks == [0, 1, 2, 3, 4, 19, 20, 21, 22, 23]
    assert "14 ranks between the 5 highest and 5 lowest peak RAM RSS left out" in out
    assert main(["report", str(tmp_path), "--all-ranks"]) == 0
    out = capsys.readouterr().out
    assert [int(ln.split()[0]) for ln in out.splitlines() if ln[:1].isdigit()] == list(range(24))
    assert f"job {tmp_path.name} (the logdir itself): 24 ranks" in out and "job .:" not in out
    assert "1.36 GiB (rank 23)" in out  # 1 + 23/64


def test_missing_ranks_are_named(tmp_path, capsys):
    for rank in (0, 2):
        write_run(tmp_path / "j" / f"rank{rank}", [0], lambda s: {RSS: 1.0})
    assert main(["report", str(tmp_path)]) == 0
    assert "job j: 2 ranks (no memory tags from rank(s) 1)" in capsys.readouterr().out


def test_png_draws_one_panel_per_job_with_the_band(job, tmp_path):
    from tbmem.analysis import load_scalars, plot_timeline

    df = load_scalars(job)
    jobs = rank_jobs(summarize(df))
    fig = plot_timeline(df, runs=["single"], jobs=jobs)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["single: process and allocator memory (RSS, VRAM)",
                      "job exp/run1: 3 ranks (band: min..max over the ranks)"]
    band = fig.axes[1]
    labels = [line.get_label() for line in band.get_lines()]
    assert labels == ["RAM RSS (mean; max on rank 1)", "process tree RSS (mean; max on rank 2)"]
    rss_mean = band.get_lines()[0].get_ydata()
    assert list(rss_mean) == pytest.approx([1.5] * 10)
    assert band.get_ylabel() == "per rank (GiB)"
    png = tmp_path / "report.png"
    assert main(["report", str(job), "--png", str(png)]) == 0
    assert png.stat().st_size > 10_000


def test_the_figure_names_a_job_in_the_logdir_itself_by_its_folder_in_the_unit_that_fits(tmp_path):
    from tbmem.analysis import load_scalars, plot_timeline

    logdir = tmp_path / "burgers_ddp"
    for rank in range(2):
        write_run(logdir / f"rank{rank}", [0, 10], lambda s, r=rank: {RSS: 0.25 + r / 16})
    df = load_scalars(logdir)
    (job,) = rank_jobs(summarize(df))
    fig = plot_timeline(df, runs=[], jobs=[job], root="burgers_ddp")
    (ax,) = fig.axes
    assert ax.get_title() == "job burgers_ddp (the logdir itself): 2 ranks (band: min..max over the ranks)"
    assert ax.get_ylabel() == "per rank (MiB)"  # 0.3125 GB at most: drawn as 320 MiB, not 0.3 on a GB axis
    assert max(ax.get_lines()[0].get_ydata()) == pytest.approx((0.25 + 0.3125) / 2 * 1024)
