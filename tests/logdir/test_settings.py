"""The run's settings side file (plugins/tbmem/settings.jsonl): written by the writer, read back by every reader;
the file is untrusted (a shared logdir)."""

from __future__ import annotations

import json
import os

from tbmem import MemoryWriter
from tbmem._internal.logdir import LogdirReader
from tbmem._internal.logdir.settings import (MAX_PATTERN_CHARS, MAX_PATTERNS, SETTINGS_LOG, RunSettings, append_settings,
                                   read_settings)


def test_lines_of_several_writers_add_up(tmp_path):
    run = str(tmp_path)
    append_settings(run, loss_tags=("train/ce_loss",), module_depth=2)
    append_settings(run, loss_tags=("val/*", "train/ce_loss"), module_depth=3)  # a resumed run
    assert read_settings(run) == RunSettings(loss_tags=("train/ce_loss", "val/*"), module_depth=3)


def test_damaged_or_hostile_content_is_skipped(tmp_path):
    path = tmp_path / SETTINGS_LOG
    path.parent.mkdir(parents=True)
    lines = [b"{not json", json.dumps([1, 2]).encode(), json.dumps({"loss_tags": "x", "module_depth": "2"}).encode(),
             json.dumps({"loss_tags": [1, "", "a" * (MAX_PATTERN_CHARS + 1), "ok/*"], "module_depth": True}).encode(),
             json.dumps({"loss_tags": [f"p{i}" for i in range(2 * MAX_PATTERNS)], "module_depth": 0}).encode()]
    path.write_bytes(b"\n".join(lines) + b"\n{\"module_depth\": 4")  # the last line cut short
    got = read_settings(str(tmp_path))
    assert got.loss_tags[0] == "ok/*" and len(got.loss_tags) == MAX_PATTERNS and got.module_depth is None


def test_a_planted_symlink_is_not_followed(tmp_path):
    outside = tmp_path / "outside.jsonl"
    outside.write_text(json.dumps({"loss_tags": ["secret"], "module_depth": 2}) + "\n")
    run = tmp_path / "run"
    (run / SETTINGS_LOG).parent.mkdir(parents=True)
    os.symlink(outside, run / SETTINGS_LOG)
    assert read_settings(str(run)) == RunSettings()
    assert LogdirReader(str(tmp_path)).settings("run") == RunSettings()  # no run there: no event files


def test_the_writer_records_only_what_differs_from_the_defaults_and_never_raises(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv("TBMEM_LOSS_TAGS", raising=False)
    monkeypatch.delenv("TBMEM_MODULE_DEPTH", raising=False)
    MemoryWriter(tmp_path / "plain", census_every=0).close()
    assert not (tmp_path / "plain" / "plugins").exists()
    MemoryWriter(tmp_path / "own", census_every=0, loss_tags=["train/ce_loss"]).close()
    reader = LogdirReader(str(tmp_path))
    assert reader.settings("own") == RunSettings(loss_tags=("train/ce_loss",), module_depth=1)
    assert reader.loss_tags("own")[-1] == "train/ce_loss" and reader.loss_tags("plain")[-1] == "loss"
    # a symlink planted where the side file goes: not followed, counted, the writer goes on
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (tmp_path / "planted" / "plugins").mkdir(parents=True)
    os.symlink(outside, tmp_path / "planted" / "plugins" / "tbmem")
    with MemoryWriter(tmp_path / "planted", census_every=0, every=1, module_depth=2) as w:
        w.log_memory(0)
    assert list(outside.iterdir()) == [] and "cannot write to" in caplog.text
