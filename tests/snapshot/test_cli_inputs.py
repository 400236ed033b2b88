"""`tbmem snapshot stats|html` on hostile input: wrong shapes, special files, deep pickles, escape sequences."""

from __future__ import annotations

import copy
import gzip
import json
import os
import struct
import subprocess
import sys

import pytest

from tbmem._internal.snapshot.schema import encode_json_gz, to_json
from tests.snapshot._helpers import small_snapshot


def _tbmem(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The real command line in a fresh process (a FIFO must not hang it: the timeout fails the test)."""
    return subprocess.run([sys.executable, "-m", "tbmem", *args], capture_output=True, text=True,
                          timeout=timeout)


def _doc() -> dict:
    doc = to_json(small_snapshot())
    doc["devices"][0]["ooms"] = [{"event": 3, "requested_bytes": 4096, "free_bytes": None, "time_us": 30}]
    return doc


def _malformed(doc: dict, case: str) -> dict:
    doc = copy.deepcopy(doc)
    if case == "categories: 1.5":
        doc["categories"] = 1.5
    elif case == "categories: a dict":
        doc["categories"] = {"activation": 1}
    elif case == "meta.library_roots: [5]":
        doc["meta"]["library_roots"] = [5]
    elif case == "meta: a list":
        doc["meta"] = ["a"]
    elif case == "ooms[0].event: a string":
        doc["devices"][0]["ooms"][0]["event"] = "x"
    elif case == "ooms[0].requested_bytes: a dict":
        doc["devices"][0]["ooms"][0]["requested_bytes"] = {"a": 1}
    elif case == "ooms[0].event: past the events":
        doc["devices"][0]["ooms"][0]["event"] = 10**6
    elif case == "markers[0].kind: a list":
        doc["devices"][0]["markers"] = [{"event": 0, "label": "x", "kind": [1]}]
    elif case == "device: a number":
        doc["devices"][0]["device"] = 7
    elif case == "v1 oom_events: a number":
        doc = {"schema": "tbmem.snapshot", "version": 1, "allocs": {}, "meta": {"oom_events": 5}}
    return doc


MALFORMED = ["categories: 1.5", "categories: a dict", "meta.library_roots: [5]", "meta: a list",
             "ooms[0].event: a string", "ooms[0].requested_bytes: a dict", "ooms[0].event: past the events",
             "markers[0].kind: a list", "device: a number", "v1 oom_events: a number"]


@pytest.mark.parametrize("case", MALFORMED)
@pytest.mark.parametrize("command", ["stats", "stats --json", "html"])
def test_a_document_of_the_wrong_shape_is_one_line_exit_2(tmp_path, case, command):
    path = tmp_path / "bad.json.gz"
    path.write_bytes(gzip.compress(json.dumps(_malformed(_doc(), case)).encode()))
    done = _tbmem("snapshot", *command.split(), str(path), *(["-o", str(tmp_path / "o.html")] if command == "html"
                                                               else []))
    assert done.returncode == 2, (case, done.stdout[-500:], done.stderr[-2000:])
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"tbmem snapshot: {path} is not a valid snapshot: snapshot field "), line
    assert not (tmp_path / "o.html").exists()


def test_the_same_document_of_the_right_shape_is_read(tmp_path):
    path = tmp_path / "good.json.gz"
    path.write_bytes(gzip.compress(json.dumps(_doc()).encode()))
    done = _tbmem("snapshot", "stats", str(path))
    assert done.returncode == 0, done.stderr
    assert "OUT OF MEMORY at event 3" in done.stdout


def test_a_deeply_nested_pickle_is_one_line_exit_2(tmp_path):
    # `html --torch` raised RecursionError (a traceback, exit 1) on a pickle of 100,000 nested lists
    n = 100_000
    path = tmp_path / "deep.pickle"
    path.write_bytes(b"\x80\x02}X" + struct.pack("<I", 8) + b"segments" + b"]" * n + b"a" * (n - 1) + b"s.")
    for command in (["html", "--torch"], ["html"], ["stats"]):
        done = _tbmem("snapshot", *command, str(path), *(["-o", str(tmp_path / "o.html")] if "html" in command
                                                          else []))
        assert done.returncode == 2, (command, done.stderr[-2000:])
        assert "Traceback" not in done.stderr
        assert len(done.stderr.splitlines()) == 1, done.stderr
        assert done.stderr.startswith("tbmem snapshot: cannot re"), done.stderr


def test_deeply_nested_json_is_one_line_exit_2(tmp_path):
    path = tmp_path / "deep.json.gz"
    path.write_bytes(gzip.compress(b'{"schema": "tbmem.snapshot", "version": 2, "meta": ' + b"[" * 100_000
                                   + b"]" * 100_000 + b"}"))
    done = _tbmem("snapshot", "stats", str(path))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr == f"tbmem snapshot: {path} is nested too deeply to be a snapshot\n"


def test_special_files_say_what_they_are(tmp_path):
    # each used to say "no such file"; a FIFO is never opened for a blocking read
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "loop_a").symlink_to(tmp_path / "loop_b")
    (tmp_path / "loop_b").symlink_to(tmp_path / "loop_a")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere.json.gz")
    expected = {
        str(tmp_path / "fifo"): "it is a FIFO (named pipe), not a snapshot file",
        "/dev/null": "it is a device, not a snapshot file",
        str(tmp_path / "loop_a"): "it is a symlink loop (too many levels of symbolic links)",
        str(tmp_path / "dangling"): f"it is a symlink to {tmp_path / 'nowhere.json.gz'}, which does not exist",
        str(tmp_path / "missing.json.gz"): "no such file",
    }
    for path, why in expected.items():
        for command in ("stats", "html"):
            done = _tbmem("snapshot", command, path, timeout=30)
            assert done.returncode == 2
            assert done.stderr == f"tbmem snapshot: cannot read {path}: {why}\n"


def test_a_directory_lists_the_snapshots_in_it(tmp_path):
    run = tmp_path / "run"
    (run / "plugins" / "tbmem").mkdir(parents=True)
    for step in (3, 12):
        (run / "plugins" / "tbmem" / f"snapshot_rank0_step{step:09d}.json.gz").write_bytes(
            encode_json_gz(small_snapshot()))
    (run / "plugins" / "tbmem" / "snapshot_rank0_step000000003.html").write_text("<html>")
    (run / "notes.txt").write_text("not a snapshot")
    done = _tbmem("snapshot", "stats", str(run))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"tbmem snapshot: {run} is a directory; give one of the snapshot files in it:",
        f"  {run}/plugins/tbmem/snapshot_rank0_step000000003.json.gz",
        f"  {run}/plugins/tbmem/snapshot_rank0_step000000012.json.gz"]
    empty = tmp_path / "empty"
    empty.mkdir()
    done = _tbmem("snapshot", "html", str(empty))
    assert done.returncode == 2
    assert done.stderr == (f"tbmem snapshot: {empty} is a directory with no snapshot files; give one of its "
                           "snapshot files (.json.gz, .json, .pickle, .pkl, .pt)\n")


def test_escape_sequences_in_frame_names_never_reach_the_terminal(tmp_path):
    hostile = "fwd\x1b[2J\x1b]52;c;cHduZWQ=\x07\nforged line: all clear\u202e"
    path = tmp_path / "s.json.gz"
    path.write_bytes(encode_json_gz(small_snapshot(frame_name=hostile)))
    done = _tbmem("snapshot", "stats", str(path))
    assert done.returncode == 0, done.stderr
    assert not any(c in done.stdout for c in "\x1b\x07\u202e")
    assert not any(line.startswith("forged line") for line in done.stdout.splitlines())
    assert "fwd\\x1b[2J\\x1b]52;c;cHduZWQ=\\x07\\nforged line: all clear\\u202e" in done.stdout
    # --json keeps the names exact (JSON escapes them itself)
    out = _tbmem("snapshot", "stats", "--json", str(path)).stdout
    assert json.dumps(hostile)[1:-1] in out and "\x1b" not in out
