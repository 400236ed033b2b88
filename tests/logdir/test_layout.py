"""The run layout is written and read by the same names: the store, the ranks, the readers and FORMATS agree."""

from __future__ import annotations

import importlib
import os

from tbmem._internal.logdir.layout import (CENSUS_LOG, FORMATS, SNAPSHOT_FILE, TEMP_FILE, census_log_path, plugin_dir,
                                 split_rank, temp_prefix)


def test_formats_name_the_versions_and_modules_that_handle_them():
    from tbmem._internal.snapshot.schema import VERSION

    formats = {f.name: f for f in FORMATS}
    assert formats["snapshot"].version == VERSION  # the schema module reads this version and the ones before
    assert formats["census side file"].path == CENSUS_LOG
    for f in FORMATS:
        for owner in (f.writer, f.reader):
            importlib.import_module(owner.split()[0])  # every module named exists


def test_the_store_names_snapshots_as_the_readers_parse_them(tmp_path):
    from tbmem._internal.snapshot.store import SnapshotStore

    store = SnapshotStore(str(tmp_path), rank=3, max_snapshots=0, max_disk_mb=0)
    files = [("json.gz", lambda fh: fh.write(b"{}")), ("html", lambda fh: fh.write(b"<html>"))]
    first, error = store.write_files("alert", 12, files)
    second, error2 = store.write_files("alert", 12, files)  # the name is taken: "-2"
    assert error is None and error2 is None
    parsed = [SNAPSHOT_FILE.match(os.path.basename(p)) for p in first + second]
    assert [(m["kind"], m["rank"], int(m["step"]), m["dup"], m["ext"]) for m in parsed] == [
        ("alert", "3", 12, None, "json.gz"), ("alert", "3", 12, None, "html"),
        ("alert", "3", 12, "2", "json.gz"), ("alert", "3", 12, "2", "html")]
    assert {os.path.dirname(p) for p in first + second} == {plugin_dir(str(tmp_path))}
    assert TEMP_FILE.match(temp_prefix(4242, "node-1.cluster".replace("-", "_")) + "abc123_x.part")


def test_rank_folders_are_written_and_grouped_by_one_rule():
    from tbmem._internal.analysis.ranks import split_rank_run
    from tbmem._internal.logdir.runs import group_runs
    from tbmem._internal.ranks.context import detect_rank

    run = os.path.relpath(detect_rank(environ={"RANK": "2", "WORLD_SIZE": "4"}).run_dir("exp/a"))
    assert run == os.path.join("exp", "a", "rank2")
    assert split_rank(run) == ("exp/a", 2) == split_rank_run(run)
    assert split_rank("rank0") == (".", 0) and split_rank("exp/rank_0") == ("exp/rank_0", None)
    assert split_rank_run("exp") is None
    assert group_runs([run, "exp/a", "exp/a/rank10"]) == [
        {"group": "exp/a", "members": [{"run": "exp/a", "rank": None}, {"run": run, "rank": 2},
                                       {"run": "exp/a/rank10", "rank": 10}]}]


def test_the_writer_puts_the_census_where_the_readers_look(tmp_path):
    from tbmem import MemoryWriter

    with MemoryWriter(tmp_path / "run", every=1, census_every=1, custom_layout=False) as w:
        w.log_memory(0)
    assert os.path.isfile(census_log_path(str(tmp_path / "run")))
    assert sorted(os.listdir(tmp_path / "run" / os.path.dirname(CENSUS_LOG))) == ["census.jsonl"]
