"""`tbmem report` fits the terminal: run names break after '/', then runs come a few at a time;
--wide keeps one table; a logdir that is itself a run is named by its folder, not '.'."""

from __future__ import annotations

import pytest

from tbmem._internal.cli import main
from tests.analysis._logdirs import CATEGORY, write_run

NAMES = ["burgers_physical_quick_test/2026-11-26_00-35-09", "burgers_quick_test/2026-11-26_00-35-02",
         "heat_physical_experiment/2026-11-26_01-10-44", "burgers_experiment/2026-11-26_01-12-13"]


@pytest.fixture
def four_runs(tmp_path):
    for i, name in enumerate(NAMES):
        write_run(tmp_path / name, range(0, 50, 10), lambda s, i=i: {
            "Memory/RAM/process_rss_GB": 0.3 + i / 10, CATEGORY.format("parameters"): 0.0084 * (i + 1)})
    return tmp_path


def _report(capsys, monkeypatch, columns, *argv):
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", str(columns))
    assert main(["report", *map(str, argv)]) == 0
    return capsys.readouterr().out.split("No leak found")[0].rstrip()


def _tables(out: str) -> list[list[str]]:
    return [t.splitlines() for t in out.split("\n\n")]


@pytest.mark.parametrize("columns", [80, 100])
def test_four_runs_fit_the_terminal(four_runs, capsys, monkeypatch, columns):
    out = _report(capsys, monkeypatch, columns, four_runs)
    assert max(len(line) for line in out.splitlines()) <= columns
    tables = _tables(out)
    assert len(tables) >= 2  # 199 columns wide in one table
    shown = {}  # every run, once, with its value in every row
    for lines in tables:
        head = [line for line in lines[:lines.index(next(ln for ln in lines if ln.startswith("---")))]]
        rss = next(ln for ln in lines if ln.startswith("peak RAM RSS")).split()[3:]
        runs = ["".join(parts) for parts in zip(*[h.split()[1 if i == len(head) - 1 else 0:] for i, h in enumerate(head)])]
        assert len(rss) == 2 * len(runs)  # "307 MiB" per run
        shown.update(zip(runs, zip(rss[::2], rss[1::2])))
    assert sorted(shown) == sorted(NAMES)


def test_the_demos_two_runs_fit_80_columns_in_one_table(tmp_path, capsys, monkeypatch):
    for name in NAMES[:2]:
        write_run(tmp_path / name, range(0, 50, 10), lambda s: {"Memory/RAM/process_rss_GB": 0.3})
    out = _report(capsys, monkeypatch, 80, tmp_path)
    lines = out.splitlines()
    assert len(_tables(out)) == 1 and max(len(line) for line in lines) <= 80  # 110 columns unbroken
    assert lines[0].split() == ["burgers_physical_quick_test/", "burgers_quick_test/"]
    assert lines[1].split() == ["metric", "2026-11-26_00-35-09", "2026-11-26_00-35-02"]


def test_wide_keeps_one_table(four_runs, capsys, monkeypatch):
    out = _report(capsys, monkeypatch, 80, four_runs, "--wide")
    assert len(_tables(out)) == 1 and out.splitlines()[0].split() == ["metric", *sorted(NAMES)]
    assert max(len(line) for line in out.splitlines()) > 150
    assert _report(capsys, monkeypatch, None, four_runs) == out  # into a pipe or a file: no limit


def test_a_logdir_that_is_a_run_is_named_by_its_folder(four_runs, capsys, monkeypatch):
    out = _report(capsys, monkeypatch, None, four_runs / NAMES[1])
    assert out.splitlines()[0].split() == ["metric", "2026-11-26_00-35-02"]
