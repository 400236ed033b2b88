"""CensusLog reads census.jsonl in bounded pieces, skips what no census line is, never follows a symlink."""

from __future__ import annotations

import json
import os

from tbmem._internal.logdir import census_log
from tbmem._internal.logdir.census_log import CensusLog


def _line(step: int, **extra) -> bytes:
    return (json.dumps({"step": step, "total_bytes": 64 * step, **extra}) + "\n").encode()


def test_a_line_over_the_limit_is_skipped_and_the_lines_after_it_are_read(tmp_path, monkeypatch):
    monkeypatch.setattr(census_log, "MAX_LINE", 4096)
    monkeypatch.setattr(census_log, "_CHUNK", 1000)
    path = tmp_path / "census.jsonl"
    path.write_bytes(_line(1) + b'{"step": 2, "pad": "' + b"x" * 50_000)
    log = CensusLog()
    assert sorted(log.read(str(path))) == [1]
    with open(path, "ab") as fh:  # the long line ends; lines follow
        fh.write(b'"}\n' + _line(3) + _line(4))
    assert sorted(log.read(str(path))) == [1, 3, 4]


def test_one_call_reads_at_most_max_read(tmp_path, monkeypatch):
    monkeypatch.setattr(census_log, "MAX_READ", 10_000)
    monkeypatch.setattr(census_log, "_CHUNK", 1000)
    path = tmp_path / "census.jsonl"
    path.write_bytes(b"".join(_line(s, notes=["n" * 200]) for s in range(200)))  # about 50 kB
    log = CensusLog()
    calls, seen = 0, {}
    while len(seen) < 200:
        seen = log.read(str(path))
        calls += 1
        assert calls < 20
    assert calls >= os.path.getsize(path) // 10_000
    assert sorted(seen) == list(range(200))


def test_a_cut_line_continued_by_the_next_one_gives_the_next_one(tmp_path):
    path = tmp_path / "census.jsonl"
    path.write_bytes(_line(1) + _line(2)[:25] + _line(3))  # a line cut short, then appended to
    assert sorted(CensusLog().read(str(path))) == [1, 3]


def test_only_a_census_lines_fields_are_returned_and_a_symlink_is_not_read(tmp_path):
    path = tmp_path / "census.jsonl"
    path.write_bytes(_line(1, secret="s", top=[]))
    assert CensusLog().read(str(path))[1] == {"step": 1, "total_bytes": 64, "top": []}
    (tmp_path / "link.jsonl").symlink_to(path)
    assert CensusLog().read(str(tmp_path / "link.jsonl")) == {}
    os.mkfifo(tmp_path / "fifo.jsonl")  # never opened for a blocking read
    assert CensusLog().read(str(tmp_path / "fifo.jsonl")) == {}
