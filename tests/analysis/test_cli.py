"""`tbmem report`: table, JSON, PNG, comparison, CI gate, and clear errors (never a traceback)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tbmem._internal.cli import main
from tests.analysis._logdirs import CATEGORY, write_run


@pytest.fixture
def logdir(tmp_path):
    write_run(tmp_path / "clean", range(0, 400, 20),
              lambda s: {"Memory/RAM/process_rss_GB": 0.5, CATEGORY.format("parameters"): 4.0,
                         "Perf/step_time_ms": 12.5})
    write_run(tmp_path / "leaky", range(0, 400, 20),
              lambda s: {"Memory/RAM/process_rss_GB": 0.75, CATEGORY.format("parameters"): 4.0,
                         CATEGORY.format("activations"): s / 2})
    return tmp_path


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["report", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_table_lists_runs_and_leak_evidence(logdir, capsys):
    code, out, err = run(capsys, logdir)
    assert code == 0 and err == ""
    header, rule, *rows = out.split("\n\n")[0].splitlines()
    assert header.split() == ["metric", "clean", "leaky"]
    table = {r[:22].strip(): r[22:].split() for r in rows}
    assert table["peak RAM RSS"] == ["512", "MiB", "768", "MiB"]
    assert table["peak VRAM allocated"] == ["n/a", "n/a"]  # a CPU run
    assert table["activations"] == ["n/a", "190", "MiB"]  # at the census peak: the last step
    assert table["leaks flagged"] == ["none", "1"]
    assert "LEAKS:" in out and "leaky: Memory/Tensor_Category/activations_MB grows +500.0 MB/1k steps" in out


def test_json_is_machine_readable(logdir, capsys):
    code, out, _ = run(capsys, logdir, "--json")
    data = json.loads(out)
    assert code == 0 and [r["run"] for r in data["runs"]] == ["clean", "leaky"]
    leaky = data["runs"][1]
    assert leaky["peak_rss_gb"] == 0.75 and leaky["peak_allocated_gb"] is None
    (leak,) = leaky["leaks"]
    assert leak["category"] == "activations" and leak["slope_mb_per_1k"] == pytest.approx(500.0)


def test_values_have_significant_digits_and_units_that_fit(tmp_path, capsys):
    """The issue's run: a tiny model (KiB of parameters, no gradients) and a loss of 6.6e-14."""
    write_run(tmp_path, range(0, 30, 10), lambda s: {
        "Memory/RAM/process_rss_GB": 0.374, CATEGORY.format("parameters"): 8836 / 2**20,
        CATEGORY.format("gradients"): 0.0, CATEGORY.format("activations"): 1.89, "Perf/step_time_ms": 0.0523,
        "Loss/evaluation": 6.556e-14})
    code, out, _ = run(capsys, tmp_path)
    table = {r[:22].strip(): r[22:].strip() for r in out.split("\n\n")[0].splitlines()[2:]}
    assert code == 0
    assert table["parameters"] == "8.63 KiB"  # was "0.01" MB
    assert table["gradients"] == "0 B"  # was "0.00"
    assert table["activations"] == "1.89 MiB"
    assert table["peak RAM RSS"] == "383 MiB"
    assert table["step time mean"] == "0.0523 ms"
    assert table["last Loss/evaluation"] == "6.556e-14"  # was "0.0000"


def test_json_turns_nan_into_null(tmp_path, capsys):
    write_run(tmp_path, range(3), lambda s: {"Memory/RAM/process_rss_GB": 0.5, "Loss/train": float("nan")})
    code, out, _ = run(capsys, tmp_path, "--json")
    assert code == 0 and json.loads(out)["runs"][0]["last_loss"] == {"Loss/train": None}


def test_fail_on_leak_and_threshold(logdir, capsys):
    assert run(capsys, logdir, "--fail-on-leak")[0] == 1
    assert run(capsys, logdir, "--fail-on-leak", "--threshold-mb-per-1k", "600")[0] == 0
    assert run(capsys, logdir / "clean", "--fail-on-leak")[0] == 0


def test_compare_two_runs(logdir, capsys):
    code, out, _ = run(capsys, logdir, "--compare", "clean", "leaky")
    assert code == 0
    rows = {r[:22].strip(): r[22:].split() for r in out.splitlines()}
    assert rows["metric"] == ["clean", "leaky", "diff", "(B-A)"]
    assert rows["peak RAM RSS"] == ["512", "MiB", "768", "MiB", "+256", "MiB"]
    code, _, err = run(capsys, logdir, "--compare", "clean", "nope")
    assert code == 2 and "no run named 'nope'" in err


def test_png_figure(logdir, capsys, tmp_path):
    png = tmp_path / "out" / "report.png"
    png.parent.mkdir()
    code, out, _ = run(capsys, logdir, "--png", png)
    assert code == 0 and f"figure written to {png}" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    code, _, err = run(capsys, logdir, "--png", tmp_path / "missing" / "x.png")
    assert code == 2 and "Traceback" not in err and err.startswith("tbmem report:")


def test_png_into_a_missing_folder_still_prints_the_table_and_says_why(logdir, capsys, tmp_path):
    missing = tmp_path / "nonexistent" / "dir" / "x.png"
    code, out, err = run(capsys, logdir, "--png", missing)
    assert code == 2
    assert "peak RAM RSS" in out and "LEAKS" in out  # the summary is not lost with the figure
    assert "figure written" not in out
    assert err == f"tbmem report: cannot write the figure: {missing}: No such file or directory\n"


def test_errors_are_one_line_and_exit_2(logdir, tmp_path, capsys):
    code, out, err = run(capsys, tmp_path / "nope")
    assert (code, out) == (2, "") and "does not exist" in err and len(err.splitlines()) == 1
    (tmp_path / "empty").mkdir()
    code, _, err = run(capsys, tmp_path / "empty")
    assert code == 2 and "no TensorBoard event files" in err
    write_run(tmp_path / "plain", range(3), lambda s: {"Loss/train": 1.0})
    code, _, err = run(capsys, tmp_path / "plain")
    assert code == 2 and "no tbmem memory tags" in err
    code, _, err = run(capsys, logdir, "--threshold-mb-per-1k", "-1")
    assert code == 2 and "threshold_mb_per_1k" in err


def test_truncated_event_file(logdir, capsys):
    run_dir = logdir / "leaky"
    (name,) = os.listdir(run_dir)
    path = run_dir / name
    path.write_bytes(path.read_bytes()[:-3])
    code, out, err = run(capsys, logdir)
    assert code == 2 and out == "" and "is damaged" in err and "--allow-truncated" in err
    code, out, _ = run(capsys, logdir, "--allow-truncated")
    assert code == 0 and "leaky" in out


def test_missing_pandas_names_the_extra(logdir, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # makes `import pandas` raise ImportError
    code, out, err = run(capsys, logdir)
    assert (code, out) == (2, "") and "pip install 'tbmem[analysis]'" in err


def test_importing_the_package_needs_neither_pandas_nor_matplotlib():
    code = ("import sys, tbmem.analysis, tbmem._internal.analysis.cli; "
            "print(sorted(m for m in ('pandas', 'matplotlib', 'torch') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_report_on_a_logdir_with_symlink_loops_finishes_and_lists_each_run_once(logdir):
    os.symlink(".", logdir / "a")
    os.symlink(".", logdir / "b")
    os.symlink(".", logdir / "clean" / "loop")
    proc = subprocess.run([sys.executable, "-m", "tbmem", "report", str(logdir), "--json"],
                          capture_output=True, text=True, timeout=120)  # the old walk never finished
    assert proc.returncode == 0, proc.stderr
    runs = [entry["run"] for entry in json.loads(proc.stdout)["runs"]]
    assert sorted(runs) == ["clean", "leaky"]
