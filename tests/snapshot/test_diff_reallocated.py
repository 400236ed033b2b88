"""``tbmem snapshot diff``: a site with as many bytes in B as in A, allocated again since A (the activations of
two steps), is not listed under "Grew" (it was, as a row of ``+0 B``), but apart, as reallocated."""

from __future__ import annotations

import json

from tbmem._internal.cli import main
from tbmem._internal.snapshot.schema import SnapshotBuilder, encode_json_gz

MiB = 2**20


def _snap(tmp_path, step):
    b = SnapshotBuilder(source="cuda", device="cuda:0")
    b.alloc(64 * MiB, category="parameter", stack=[("/u/model.py", 3, "init")], time_us=0, addr=0x1000)
    for i in range(3):  # the same sizes each step, at other addresses
        b.alloc(MiB, category="activation", stack=[("/u/train.py", 9, "step")], time_us=1 + i,
                addr=0x10000000 + (step * 8 + i) * MiB)
    path = tmp_path / f"s{step}.json.gz"
    path.write_bytes(encode_json_gz(b.build(kind="snapshot", step=step)))
    return str(path)


def test_same_bytes_allocated_again_are_not_growth(tmp_path, capsys):
    a, b = _snap(tmp_path, 1), _snap(tmp_path, 2)
    assert main(["snapshot", "diff", a, b, "--json"]) == 0
    (dev,) = json.loads(capsys.readouterr().out)["devices"]
    assert dev["delta_bytes"] == 0 and dev["grew"] == [] and dev["shrank"] == []
    (row,) = dev["reallocated"]
    assert (row["label"], row["delta_bytes"], row["new_bytes"], row["new_count"]) == ("step (/u/train.py:9)", 0, 3 * MiB, 3)
    assert main(["snapshot", "diff", a, b]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert not any(line.startswith("Grew") for line in lines)
    at = lines.index("Same size, allocated again since A")
    assert lines[at + 2].split()[:2] == ["+0", "B"] and "step (/u/train.py:9)" in lines[at + 2]
