"""``tbmem snapshot html`` and ``stats``: every device, ``--json``, ``--device``, and one line + exit 2 on bad files."""

from __future__ import annotations

import gzip
import json
import pickle
import subprocess
import sys

import pytest

from tbmem._internal.cli import main
from tbmem._internal.snapshot.schema import encode_json_gz
from tests.snapshot._helpers import EVIL, small_snapshot, torch_dict


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
    assert lines[0].startswith("snapshot step 7 rank 0: dispatch, 1 device(s) (cpu)")
    top = lines[lines.index("Top 3 allocations by size") + 2]
    assert top.split()[:3] == ["40.0", "KiB", "activation"]
    assert "By category" in text and "parameter" in text


def test_stats_json_schema_every_device(tmp_path, capsys):
    src = tmp_path / "snap.pickle"
    src.write_bytes(pickle.dumps(torch_dict(), protocol=4))
    assert main(["snapshot", "stats", str(src), "--json", "--top", "2"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert list(doc) == ["devices"]
    assert [d["device"] for d in doc["devices"]] == ["cuda:0", "cuda:1"]
    for d in doc["devices"]:
        assert set(d) == {"device", "reserved_bytes", "allocated_bytes", "requested_bytes", "peak_bytes", "peak_event",
                          "baseline_bytes", "trace_events", "ooms", "top_allocations", "explain", "pools"}
        sizes = [t["bytes"] for t in d["top_allocations"]]
        assert sizes == sorted(sizes, reverse=True)
        for t in d["top_allocations"]:
            assert set(t) == {"bytes", "category", "frame", "generated", "alive_at_peak"}
    one = doc["devices"][1]
    [oom] = one["ooms"]
    assert {k: oom[k] for k in ("requested_bytes", "free_bytes", "time_us")} == {
        "requested_bytes": 1 << 30, "free_bytes": 4096, "time_us": 1_757_000_000_000_009}
    assert {"largest_free_block_bytes", "advice", "verdict", "live_by_site", "settings"} <= set(oom)  # issue 38
    assert main(["snapshot", "stats", str(src), "--json", "--device", "1"]) == 0
    assert [d["device"] for d in json.loads(capsys.readouterr().out)["devices"]] == ["cuda:1"]


def test_unknown_device_is_one_line_exit_2(tmp_path, capsys):
    src = tmp_path / "snap.pickle"
    src.write_bytes(pickle.dumps(torch_dict(), protocol=4))
    assert main(["snapshot", "stats", str(src), "--device", "cuda:7"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no device 'cuda:7'" in err[0] and "cuda:0, cuda:1" in err[0]


def test_torch_pickle_html_with_torch_viewer(tmp_path):
    src = tmp_path / "snap.pickle"
    src.write_bytes(pickle.dumps(torch_dict(), protocol=4))
    out = tmp_path / "torch.html"
    assert main(["snapshot", "html", str(src), "-o", str(out), "--torch"]) == 0
    assert "add_local_files" in out.read_text()  # PyTorch's own trace_plot page


def test_help_says_pickles_are_read_as_plain_data(capsys):
    with pytest.raises(SystemExit):
        main(["snapshot", "html", "--help"])
    assert "no code from the file runs" in " ".join(capsys.readouterr().out.split())


def _bad_files(tmp_path):
    whole = pickle.dumps(torch_dict(), protocol=4)
    good_gz = encode_json_gz(small_snapshot())
    cases = {
        "not_gzip.json.gz": b"not gzip",
        "truncated.pickle": whole[: len(whole) // 2],
        "truncated.json.gz": good_gz[: len(good_gz) // 2],
        "empty.pickle": b"",
        "garbage.pickle": b"\x80\x04\xff\xff\xff",
        "not_a_snapshot.pickle": pickle.dumps({"hello": 1}),
        "wrong_types.pickle": pickle.dumps({"segments": 5, "device_traces": "x"}),
        "bad_event.pickle": pickle.dumps({"segments": [], "device_traces": [[{"action": "alloc", "addr": "x",
                                                                              "size": 1, "frames": []}]]}),
        "json_not_snapshot.json.gz": gzip.compress(b'{"schema": "other"}'),
        "json_bad_column.json.gz": gzip.compress(json.dumps({"schema": "tbmem.snapshot", "version": 2,
                                                             "devices": [{"n_events": 1, "time_us": [0],
                                                                          "allocs": {"size": [1], "start": [5]}}]
                                                             }).encode()),
    }
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
    return sorted(cases)


@pytest.mark.parametrize("command", ["stats", "html"])
def test_bad_files_one_line_exit_2_never_a_traceback(tmp_path, command):
    # issue 16 #9: a real process, as a user runs it; the old code printed tracebacks (exit 1)
    for name in _bad_files(tmp_path) + ["missing.pickle"]:
        args = [sys.executable, "-m", "tbmem", "snapshot", command, str(tmp_path / name)]
        if command == "html":
            args += ["-o", str(tmp_path / "out.html")]
        proc = subprocess.run(args, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, (name, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("tbmem snapshot: "), (name, proc.stderr)
        assert name in lines[0] and "Traceback" not in proc.stderr


@pytest.mark.parametrize("content", [bytes(range(7, 256)) * 3, b"hello\n", b'{"a": 1}'])
def test_a_file_that_is_no_snapshot_says_so_and_names_the_formats(tmp_path, capsys, content):
    # issue 15: random.txt used to give "Expecting value: line 1 column 1 (char 0)"
    path = tmp_path / "random.txt"
    path.write_bytes(content)
    assert main(["snapshot", "html", str(path), "-o", str(tmp_path / "x.html")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"tbmem snapshot: {path} is not a snapshot: tbmem reads its own snapshots (.json.gz, or .json) "
                   "and PyTorch memory snapshot pickles (torch.cuda.memory._dump_snapshot, .pickle)")
    assert not (tmp_path / "x.html").exists()


def test_html_writes_beside_the_file_without_o(tmp_path, capsys):
    src = tmp_path / "oom_step000006.json.gz"
    src.write_bytes(encode_json_gz(small_snapshot()))
    assert main(["snapshot", "html", str(src)]) == 0
    out = tmp_path / "oom_step000006.html"
    assert capsys.readouterr().out.strip() == str(out)
    assert "tbmemViewer" in out.read_text(encoding="utf-8")
