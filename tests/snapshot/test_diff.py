"""``tbmem snapshot diff A B``: what is alive in B and not in A, by site and category, text and --json."""

from __future__ import annotations

import json

from tbmem._internal.cli import main
from tbmem._internal.snapshot.schema import SnapshotBuilder, encode_json_gz

MiB = 2**20


def _snap(step, acts, leak=0):
    b = SnapshotBuilder(source="cuda", device="cuda:0")
    b.alloc(64 * MiB, category="parameter", stack=[("/u/model.py", 3, "init")], time_us=0, addr=0x1000)
    for i in range(acts):
        b.alloc(MiB, category="activation", stack=[("/u/train.py", 9, "step")], time_us=1 + i, addr=0x10000000 + i * MiB)
    for i in range(leak):
        b.alloc(2 * MiB, category="activation", stack=[("/u/cache.py", 20, "remember")], time_us=100 + i,
                addr=0x40000000 + (step + i) * 4 * MiB)
    return b.build(kind="snapshot", step=step)


def _write(tmp_path, name, snap):
    path = tmp_path / name
    path.write_bytes(encode_json_gz(snap))
    return str(path)


def test_what_grew_largest_first_with_what_is_new(tmp_path, capsys):
    a = _write(tmp_path, "a.json.gz", _snap(100, 4, leak=1))
    b = _write(tmp_path, "b.json.gz", _snap(200, 3, leak=5))
    assert main(["snapshot", "diff", a, b, "--json"]) == 0
    (dev,) = json.loads(capsys.readouterr().out)["devices"]
    assert (dev["a"]["allocated_bytes"], dev["b"]["allocated_bytes"]) == (70 * MiB, 77 * MiB)
    assert dev["delta_bytes"] == 7 * MiB
    top = dev["grew"][0]
    assert (top["label"], top["delta_bytes"], top["a_count"], top["b_count"]) == ("remember (/u/cache.py:20)", 8 * MiB, 1, 5)
    assert top["frame"] == {"filename": "/u/cache.py", "line": 20, "name": "remember"}
    assert (top["new_bytes"], top["new_count"]) == (10 * MiB, 5)  # other addresses: none of them was alive in A
    assert [r["label"] for r in dev["shrank"]] == ["step (/u/train.py:9)"] and dev["shrank"][0]["delta_bytes"] == -MiB
    # the parameters are the same tensors in both: neither grown nor new
    assert all(r["label"] != "init (/u/model.py:3)" for r in dev["grew"] + dev["shrank"])
    assert main(["snapshot", "diff", a, b]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    grew = lines.index("Grew (largest first; new: allocated since A)")
    assert lines[grew + 2].split()[:2] == ["+8.0", "MiB"] and "remember (/u/cache.py:20)" in lines[grew + 2]
    assert "70.0 MiB (6) -> 77.0 MiB (9), +7.0 MiB" in text


def test_peak_device_and_errors(tmp_path, capsys):
    a = _write(tmp_path, "a.json.gz", _snap(1, 1))
    b = _write(tmp_path, "b.json.gz", _snap(2, 2))
    assert main(["snapshot", "diff", a, b, "--json", "--at", "peak", "--device", "0"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["at"] == "peak" and doc["devices"][0]["delta_bytes"] == MiB
    assert main(["snapshot", "diff", a, b, "--device", "cuda:5"]) == 2
    assert "no device 'cuda:5' in either snapshot" in capsys.readouterr().err
    assert main(["snapshot", "diff", a, str(tmp_path / "missing.json.gz")]) == 2


def test_html_of_several_snapshots_is_one_page(tmp_path, capsys):
    a = _write(tmp_path, "a.json.gz", _snap(1, 1))
    b = _write(tmp_path, "b.json.gz", _snap(2, 2))
    assert main(["snapshot", "html", a, b]) == 0
    out = capsys.readouterr().out.strip()
    assert out == str(tmp_path / "a_and_1_more.html")
    page = (tmp_path / "a_and_1_more.html").read_text(encoding="utf-8")
    assert page.count('"name":"a.json.gz"') == 1 and page.count('"name":"b.json.gz"') == 1
