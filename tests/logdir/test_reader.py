"""LogdirReader reads what MemoryWriter wrote (censuses, snapshots) by run name, and nothing outside the logdir."""

from __future__ import annotations

import os

import pytest

from tbmem import MemoryWriter
from tbmem._internal.logdir import LogdirReader
from tbmem._internal.logdir.events import CPU_EPOCH_TAG, OLD_EPOCH_TAG, current_name, event_files, read_columns


def _run(path, steps=4, **options):
    with MemoryWriter(path, every=1, census_every=2, custom_layout=False, **options) as w:
        for step in range(steps):
            w.log_memory(step)


def test_the_reader_reads_what_the_writer_wrote(tmp_path):
    _run(tmp_path / "exp" / "a", snapshot={"steps": [2], "html": False})
    reader = LogdirReader(tmp_path)
    assert reader.runs() == ["exp/a"]
    census = reader.census("exp/a")
    assert sorted(census) == [0, 2] and all(c["total_bytes"] >= 0 and c["step"] == s for s, c in census.items())
    snaps = reader.snapshots("exp/a")
    assert [(s.name, s.kind, s.rank, s.step, s.format) for s in snaps] == [
        ("plugins/tbmem/snapshot_rank0_step000000002.json.gz", "snapshot", 0, 2, "tbmem")]
    assert snaps[0].path == os.path.realpath(tmp_path / "exp" / "a" / snaps[0].name)
    assert reader.census("nope") == {} and reader.snapshots("nope") == [] and reader.run_dir("nope") is None


def test_a_run_written_after_the_first_read_is_found(tmp_path):
    _run(tmp_path / "a", steps=1)
    reader = LogdirReader(tmp_path)
    assert reader.runs() == ["a"] and reader.run_dir("b") is None
    _run(tmp_path / "b", steps=3)
    assert sorted(reader.census("b")) == [0, 2]


def test_a_run_linked_from_outside_the_logdir_is_not_read(tmp_path):
    _run(tmp_path / "outside", snapshot={"steps": [0], "html": False})
    (tmp_path / "logs").mkdir()
    os.symlink(tmp_path / "outside", tmp_path / "logs" / "linked")
    reader = LogdirReader(tmp_path / "logs")
    assert reader.runs() == ["linked"]  # tbmem report reads its events (find_runs follows links) ...
    assert reader.run_dir("linked") is None  # ... but its side files are outside: as in the Memory tab
    assert reader.census("linked") == {} and reader.snapshots("linked") == []


def test_a_mapping_of_run_names_instead_of_a_logdir(tmp_path):
    _run(tmp_path / "r")
    root = os.path.realpath(tmp_path)
    reader = LogdirReader(run_dir=lambda run: (os.path.join(root, run), root) if run == "r" else None)
    assert reader.runs() == [] and sorted(reader.census("r")) == [0, 2]
    with pytest.raises(ValueError, match="logdir or a run_dir"):
        LogdirReader()


def test_events_and_old_tag_names(tmp_path):
    with MemoryWriter(tmp_path / "r", custom_layout=False) as w:
        w.write_scalars({"Memory/vram_allocated_GB": 1.5}, step=3)
        w.add_text("Memory/Large_Tensors/top_k", "| 1 | `w` | parameters | 2x2 | float32 | cpu | 0.001 |", 3)
    numbers, words = read_columns(event_files(tmp_path))
    assert (numbers["tag"], numbers["value"]) == (["Memory/vram_allocated_GB"], [1.5])
    assert words["tag"] == ["Memory/Large_Tensors/top_k"]  # without torch's /text_summary
    assert current_name("Memory/vram_allocated_GB") == "Memory/GPU/vram_allocated_GB"
    assert current_name(OLD_EPOCH_TAG) == "Monitor/epoch_gpu_peak_MB"
    assert current_name(OLD_EPOCH_TAG, gpu_run=False) == CPU_EPOCH_TAG
