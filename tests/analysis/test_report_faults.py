"""`tbmem report` with hostile run names and figure paths that cannot be written as asked."""

from __future__ import annotations

import json

import pytest

from tbmem._internal.cli import main
from tests.analysis._logdirs import CATEGORY, write_run

HOSTILE = ["clear\x1b[2J\x1b[H", "clip\x1b]52;c;cHduZWQ=\x07", "two\nforged line: no leak found", "bidi\u202egnp.exe"]


@pytest.fixture
def hostile_logdir(tmp_path):
    for i, name in enumerate(HOSTILE):
        write_run(tmp_path / "logs" / name, range(0, 200, 20),
                  lambda s, i=i: {"Memory/RAM/process_rss_GB": 0.5 + i / 4, CATEGORY.format("parameters"): 4.0})
    return tmp_path / "logs"


def test_escape_sequences_in_run_names_never_reach_the_terminal(hostile_logdir, capsys):
    code = main(["report", str(hostile_logdir), "--png", str(hostile_logdir.parent / "fig.png")])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert not any(c in out + err for c in "\x1b\x07\u202e")
    assert not any(line.startswith("forged line") for line in out.splitlines())
    header = out.splitlines()[0]
    for escaped in ("clear\\x1b[2J\\x1b[H", "clip\\x1b]52;c;cHduZWQ=\\x07", "two\\nforged line: no leak found",
                    "bidi\\u202egnp.exe"):
        assert escaped in header
    # --json keeps the names exact: JSON escapes them itself
    assert main(["report", str(hostile_logdir), "--json"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and sorted(r["run"] for r in json.loads(out)["runs"]) == sorted(HOSTILE)


def test_png_to_a_full_device_fails_with_one_line(hostile_logdir, capsys):
    # /dev/full used to report success: matplotlib let the failed write pass
    code = main(["report", str(hostile_logdir), "--png", "/dev/full"])
    out, err = capsys.readouterr()
    assert code == 2
    assert err == "tbmem report: cannot write the figure: /dev/full: No space left on device\n"
    assert "figure written" not in out


def test_png_to_a_directory_or_a_name_without_suffix(hostile_logdir, tmp_path, capsys):
    folder = tmp_path / "figures"
    folder.mkdir()
    code = main(["report", str(hostile_logdir), "--png", str(folder)])
    out, err = capsys.readouterr()
    assert code == 2
    assert err == f"tbmem report: cannot write the figure: {folder}: Is a directory\n"
    assert list(tmp_path.glob("figures*")) == [folder] and list(folder.iterdir()) == []
    # a name without a suffix: a PNG under exactly that name (matplotlib wrote "<name>.png" and the line
    # named the other file)
    target = tmp_path / "timeline"
    assert main(["report", str(hostile_logdir), "--png", str(target)]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith(f"figure written to {target}")
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (tmp_path / "timeline.png").exists()
    assert main(["report", str(hostile_logdir), "--png", str(tmp_path / "fig.nope")]) == 2
    assert capsys.readouterr().err.startswith(f"tbmem report: cannot write the figure: {tmp_path / 'fig.nope'}: "
                                              "no figure format for .nope (use one of ")
