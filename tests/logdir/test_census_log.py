"""The census side file: written by MemoryWriter at every census, read incrementally, never fatal."""

from __future__ import annotations

import json
import os

import pytest
import torch

from tbmem import MemoryWriter
from tbmem.analysis import load_scalars, load_texts
from tbmem._internal.census.report import Census, TensorRecord
from tbmem._internal.logdir.census_log import CensusLog, append_census, census_log_path, parse_census_markdown


def _train(log_dir, steps=6, census_every=2):
    model = torch.nn.Linear(128, 64)
    with MemoryWriter(log_dir, every=1, census_every=census_every, top_k=3, custom_layout=False) as w:
        w.watch(model)
        for step in range(steps):
            model(torch.randn(4, 128)).sum().backward()
            w.log_memory(step)


def test_writer_appends_every_census_with_exact_bytes(tmp_path):
    _train(tmp_path)
    records = CensusLog().read(census_log_path(str(tmp_path)))
    assert sorted(records) == [0, 2, 4]
    rec = records[4]
    assert rec["by_category"]["parameters"] == (128 * 64 + 64) * 4
    assert rec["by_category"]["gradients"] == (128 * 64 + 64) * 4
    assert rec["total_bytes"] == sum(rec["by_category"].values())
    assert [t["name"] for t in rec["top"]][:2] == ["model.weight", "model.weight.grad"]
    assert rec["top"][0]["shape"] == [64, 128] and rec["top"][0]["bytes"] == 128 * 64 * 4
    # the same census as the scalars and the markdown table in the event files
    df = load_scalars(tmp_path)
    total = df[(df.tag == "Memory/Tensor_Census/total_MB") & (df.step == 4)].value.iloc[0]
    assert rec["total_bytes"] / 2**20 == pytest.approx(total, rel=1e-6)
    texts = load_texts(tmp_path)
    rows = parse_census_markdown(texts[texts.step == 4].value.iloc[0])
    assert [r["name"] for r in rows] == [t["name"] for t in rec["top"]]


def test_unwritable_side_file_is_reported_once_and_the_census_goes_on(tmp_path, tbmem_log):
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "tbmem").write_text("a file where the folder should be")
    _train(tmp_path, steps=6, census_every=2)
    df = load_scalars(tmp_path)
    assert sorted(df[df.tag == "Memory/Tensor_Census/total_MB"].step) == [0, 2, 4]  # every census still logged
    # one line for the cause, and the count at close, like every other write the disk refuses
    causes = [r.getMessage() for r in tbmem_log.records if "cannot write to" in r.getMessage()]
    assert len(causes) == 1 and os.path.join("plugins", "tbmem") in causes[0]
    closing = [r.getMessage() for r in tbmem_log.records if "could not be written" in r.getMessage()]
    assert len(closing) == 1 and "3 census records of the Memory tab" in closing[0]


def _census(name: str, nbytes: int) -> Census:
    rec = TensorRecord(name=name, category="activations", shape=(nbytes // 4,), dtype="float32", device="cpu",
                       bytes=nbytes)
    return Census.from_records([rec], large_tensor_bytes=1, top_k=5)


def test_reader_is_incremental_and_keeps_the_last_write_of_a_step(tmp_path):
    log = CensusLog()
    path = census_log_path(str(tmp_path))
    assert log.read(path) == {}
    append_census(str(tmp_path), 1, _census("a", 400))
    append_census(str(tmp_path), 2, _census("b", 800))
    assert {s: r["top"][0]["name"] for s, r in log.read(path).items()} == {1: "a", 2: "b"}
    append_census(str(tmp_path), 2, _census("restarted", 1200))  # a restarted run writes step 2 again
    with open(path, "a") as fh:
        fh.write('{"step": 3, "top": [')  # a line still being written: not read yet
    got = log.read(path)
    assert got[2]["top"][0]["name"] == "restarted" and 3 not in got
    with open(path, "a") as fh:
        fh.write("]}\nnot json\n")
    assert log.read(path)[3]["top"] == []  # completed, and the damaged line after it is skipped
    os.unlink(path)
    append_census(str(tmp_path), 9, _census("new", 4))  # the file was replaced: read afresh
    assert sorted(log.read(path)) == [9]


def test_markdown_parser_reads_the_census_table_with_escaped_names():
    recs = [TensorRecord(name="a|b", category="other", shape=(), dtype="float32", device="cpu", bytes=4),
            TensorRecord(name="x.weight", category="parameters", shape=(3, 5), dtype="float16", device="cuda:0",
                         bytes=3 * 2**20)]
    rows = parse_census_markdown(Census.from_records(recs, large_tensor_bytes=1, top_k=5).to_markdown())
    assert [(r["name"], r["shape"], r["device"]) for r in rows] == [("x.weight", [3, 5], "cuda:0"), ("a|b", [], "cpu")]
    assert rows[0]["bytes"] == 3 * 2**20 and rows[0]["approx"] is True


def test_record_is_json_without_nan(tmp_path):
    append_census(str(tmp_path), 0, _census("a", 4))
    with open(census_log_path(str(tmp_path))) as fh:
        line = fh.readline()
    assert json.loads(line)["step"] == 0 and "NaN" not in line


def test_a_side_file_folder_removed_between_censuses_is_made_again(tmp_path, tbmem_log):
    import shutil

    append_census(str(tmp_path), 0, _census("a", 4))
    shutil.rmtree(tmp_path / "plugins")  # the folder is made once per process, then assumed: not here
    append_census(str(tmp_path), 1, _census("b", 8))
    assert sorted(CensusLog().read(census_log_path(str(tmp_path)))) == [1]
    assert not [r for r in tbmem_log.records if "census" in r.getMessage()]
    with open(census_log_path(str(tmp_path))) as fh:
        line = fh.read()
    assert line.count("\n") == 1 and json.loads(line)["total_bytes"] == 8
    # the bytes are those json.dumps writes with the same options
    assert line == json.dumps(json.loads(line), separators=(",", ":"), allow_nan=False) + "\n"
