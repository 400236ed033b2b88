"""``tbmem snapshot html`` and ``tbmem snapshot stats``; pickles only on explicit request."""

from __future__ import annotations

import pickle

import pytest

from tbmem.cli import main
from tbmem.snapshot import load_snapshot
from tbmem.snapshot.schema import encode_json_gz
from tests.snapshot._helpers import EVIL, small_snapshot
from tests.snapshot.test_cuda import _torch_dict


def test_html_and_stats_from_json(tmp_path, capsys):
    src = tmp_path / "s.json.gz"
    src.write_bytes(encode_json_gz(small_snapshot(frame_name=EVIL)))
    out = tmp_path / "s.html"
    assert main(["snapshot", "html", str(src), "-o", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert EVIL not in page and "\\u003cscript\\u003ealert(1)\\u003c/script\\u003e" in page
    assert "http://" not in page and "https://" not in page
    capsys.readouterr()
    assert main(["snapshot", "stats", str(src), "--top", "3"]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert lines[0].startswith("snapshot step 7 rank 0: dispatch on cpu, 60 events, 41 allocations")
    top = lines[lines.index("Top 3 allocations by size") + 2]
    assert top.split()[:3] == ["40.0", "KiB", "activation"]
    assert "By category" in text and "parameter" in text


def test_torch_pickle_read_as_plain_data(tmp_path, capsys):
    src = tmp_path / "snap.pickle"
    with open(src, "wb") as fh:
        pickle.dump(_torch_dict(), fh, protocol=4)
    assert load_snapshot(src).n_events == 5
    assert main(["snapshot", "stats", str(src)]) == 0
    assert "cuda on cuda:0, 5 events, 5 allocations" in capsys.readouterr().out
    out = tmp_path / "torch.html"
    assert main(["snapshot", "html", str(src), "-o", str(out), "--torch"]) == 0
    assert "add_local_files" in out.read_text()  # PyTorch's own trace_plot page


def test_help_says_pickles_are_read_as_plain_data(capsys):
    with pytest.raises(SystemExit):
        main(["snapshot", "html", "--help"])
    assert "no code from the file runs" in " ".join(capsys.readouterr().out.split())


def test_bad_file_is_an_error_not_a_traceback(tmp_path, capsys):
    bad = tmp_path / "x.json.gz"
    bad.write_bytes(b"not gzip")
    assert main(["snapshot", "stats", str(bad)]) == 2
    assert "cannot read" in capsys.readouterr().err
