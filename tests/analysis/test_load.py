"""load_scalars/load_texts/find_runs read real event files; damaged files are reported, not hidden."""

from __future__ import annotations

import logging
import os

import pytest

from tbmem import MemoryWriter
from tbmem.analysis import (CorruptEventFileError, LogdirNotFoundError, NoEventFilesError, find_runs,
                            load_scalars, load_scalars_and_texts, load_texts)
from tests.analysis._logdirs import write_run


@pytest.fixture
def two_runs(tmp_path):
    write_run(tmp_path / "exp" / "a", range(0, 30, 10),
              lambda s: {"Memory/RAM/process_rss_GB": 1.0 + s / 8, "Loss/train": 0.5})
    write_run(tmp_path / "b", [5, 7], lambda s: {"Memory/GPU/vram_allocated_GB": s * 0.25})
    return tmp_path


def _event_file(run_dir):
    (name,) = [n for n in os.listdir(run_dir) if n.startswith("events.out.tfevents")]
    return run_dir / name


def test_find_runs_names_runs_relative_to_logdir(two_runs):
    runs = find_runs(two_runs)
    assert sorted(runs) == ["b", "exp/a"]
    assert all(len(files) == 1 and files[0].name.startswith("events.out.tfevents") for files in runs.values())
    assert list(find_runs(two_runs / "b")) == ["b"]  # a logdir that is itself a run: named by its folder


def test_symlink_loops_end_and_each_real_directory_is_one_run(two_runs):
    # One loop only: the old walk reported each run 41 times; with two it never ended, which
    # tests/analysis/test_cli.py checks in a child process with a time limit.
    os.symlink(".", two_runs / "loop")
    os.symlink("exp/a", two_runs / "also_a")  # another name for a real run
    os.symlink("missing", two_runs / "dangling")
    runs = find_runs(two_runs)
    assert sorted(runs) == ["b", "exp/a"]  # named by the path without links
    df = load_scalars(two_runs)
    assert sorted(df.run.unique()) == ["b", "exp/a"] and len(df) == 3 + 3 + 2


def test_a_linked_run_outside_the_logdir_is_read_once(two_runs, tmp_path_factory):
    outside = tmp_path_factory.mktemp("outside")
    write_run(outside / "c", [1], lambda s: {"Loss/train": 1.0})
    os.symlink(outside, two_runs / "elsewhere")
    os.symlink(outside / "c", two_runs / "c_again")
    assert sorted(find_runs(two_runs)) == ["b", "c_again", "exp/a"]


def test_load_scalars_returns_every_value_with_types(two_runs):
    df = load_scalars(two_runs)
    assert list(df.columns) == ["run", "tag", "step", "wall_time", "value"]
    assert str(df["step"].dtype) == "int64" and str(df["value"].dtype) == "float64"
    rows = [tuple(r) for r in df[["run", "tag", "step", "value"]].itertuples(index=False)]
    assert rows == [
        ("b", "Memory/GPU/vram_allocated_GB", 5, 1.25), ("b", "Memory/GPU/vram_allocated_GB", 7, 1.75),
        ("exp/a", "Loss/train", 0, 0.5), ("exp/a", "Loss/train", 10, 0.5), ("exp/a", "Loss/train", 20, 0.5),
        ("exp/a", "Memory/RAM/process_rss_GB", 0, 1.0), ("exp/a", "Memory/RAM/process_rss_GB", 10, 2.25),
        ("exp/a", "Memory/RAM/process_rss_GB", 20, 3.5),
    ]
    assert (df["wall_time"] > 1e9).all()


def test_load_scalars_selects_runs_and_rejects_unknown(two_runs):
    assert set(load_scalars(two_runs, runs=["b"])["run"]) == {"b"}
    with pytest.raises(Exception, match="no run named 'zzz'"):
        load_scalars(two_runs, runs=["zzz"])


def test_add_scalar_values_and_rewritten_steps_keep_the_latest(tmp_path):
    with MemoryWriter(str(tmp_path), custom_layout=False) as w:
        w.add_scalar("Loss/train", 2.0, 1, walltime=100.0)
        w.add_scalar("Loss/train", 3.0, 1, walltime=200.0)  # a restarted run rewrites step 1
        w.add_scalar("Loss/train", 4.0, 2, walltime=300.0)
    df = load_scalars(tmp_path)
    assert df[["step", "value"]].values.tolist() == [[1, 3.0], [2, 4.0]]


def test_load_texts_reads_add_text(tmp_path):
    with MemoryWriter(str(tmp_path), custom_layout=False) as w:
        w.add_text("Memory/Large_Tensors/top_k", "| name | MB |", 10)
    df = load_texts(tmp_path)
    expected = [["Memory/Large_Tensors/top_k", 10, "| name | MB |"]]  # torch's /text_summary suffix dropped
    assert df[["tag", "step", "value"]].values.tolist() == expected


def test_one_pass_gives_what_the_two_loaders_give_and_reports_a_damaged_file_once(tmp_path, tbmem_log):
    import pandas as pd

    with MemoryWriter(str(tmp_path / "run"), every=1, custom_layout=False) as w:
        for step in range(5):
            w.write_scalars({"Memory/RAM/process_rss_GB": 1.0 + step, "Loss/train": 0.5 / (step + 1)}, step)
            w.add_text("Memory/Large_Tensors/top_k", f"| step {step} |", step)
    scalars, texts = load_scalars_and_texts(tmp_path)
    pd.testing.assert_frame_equal(scalars, load_scalars(tmp_path))
    pd.testing.assert_frame_equal(texts, load_texts(tmp_path))
    assert len(scalars) == 10 and texts["value"].tolist() == [f"| step {s} |" for s in range(5)]
    path = _event_file(tmp_path / "run")
    path.write_bytes(path.read_bytes()[:-5])
    tbmem_log.clear()
    scalars, texts = load_scalars_and_texts(tmp_path, on_error="warn")
    assert len(texts) == 4  # the last record (a text) was cut
    assert sum("is damaged" in r.getMessage() for r in tbmem_log.records) == 1


def test_missing_logdir_and_empty_logdir_raise_clear_errors(tmp_path):
    with pytest.raises(LogdirNotFoundError, match="does not exist"):
        load_scalars(tmp_path / "nope")
    (tmp_path / "notes.txt").write_text("no events here")
    with pytest.raises(NoEventFilesError, match="no TensorBoard event files"):
        load_scalars(tmp_path)


def test_truncated_event_file_raises_or_keeps_the_readable_part(two_runs, tbmem_log):
    path = _event_file(two_runs / "b")
    data = path.read_bytes()
    path.write_bytes(data[:-5])  # cut into the last record
    with pytest.raises(CorruptEventFileError, match=r"damaged: only \d+ of its \d+ bytes"):
        load_scalars(two_runs)
    df = load_scalars(two_runs, on_error="warn")
    assert df[df["run"] == "b"][["step", "value"]].values.tolist() == [[5, 1.25]]
    assert len(df[df["run"] == "exp/a"]) == 6
    assert any("is damaged" in r.getMessage() and r.levelno == logging.WARNING for r in tbmem_log.records)


def test_corrupt_checksum_in_the_middle_is_reported(two_runs):
    path = _event_file(two_runs / "exp" / "a")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptEventFileError, match="exp/a"):
        load_scalars(two_runs)


def test_progress_bar_on_request(two_runs, capsys):
    load_scalars(two_runs, progress=True)
    assert "reading event files" in capsys.readouterr().err
    load_scalars(two_runs)  # two files: below the automatic threshold
    assert "reading event files" not in capsys.readouterr().err


def test_bad_on_error_value(two_runs):
    with pytest.raises(ValueError, match="on_error"):
        load_scalars(two_runs, on_error="ignore")


def test_tensor_scalars_of_the_v2_summary_api_are_read(tmp_path):
    np = pytest.importorskip("numpy")
    from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboard.util import tensor_util

    meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="scalars"))
    with MemoryWriter(str(tmp_path), custom_layout=False) as w:
        values = [Summary.Value(tag=f"Memory/{dt.__name__}", metadata=meta,
                                tensor=tensor_util.make_tensor_proto(dt(2.5))) for dt in (np.float32, np.float64)]
        values.append(Summary.Value(tag="Memory/vector", metadata=meta,
                                    tensor=tensor_util.make_tensor_proto(np.ones(3, np.float32))))
        w.summary_writer._get_file_writer().add_summary(Summary(value=values), 3)
    df = load_scalars(tmp_path)
    assert df[["tag", "step", "value"]].values.tolist() == [["Memory/float32", 3, 2.5], ["Memory/float64", 3, 2.5]]


def test_logs_written_before_the_renames_read_under_the_current_names(tmp_path):
    from tbmem.analysis import load_scalars, summarize

    write_run(tmp_path / "gpu", [0, 10], lambda s: {"Memory/vram_allocated_GB": 1.5, "Memory/RAM/process_rss_GB": 2.0,
                                                   "Memory/Epoch/gpu_peak_MB": 700.0,
                                                   "Memory/Operation/load_cpu_delta_MB": 3.0})
    write_run(tmp_path / "cpu", [0, 10], lambda s: {"Memory/RAM/process_rss_GB": 0.5, "Memory/Epoch/gpu_peak_MB": 512.0,
                                                   "Memory/RAM/system_used_GB": 8.0})
    df = load_scalars(tmp_path)
    tags = {run: set(g["tag"]) for run, g in df.groupby("run")}
    assert tags["gpu"] == {"Memory/GPU/vram_allocated_GB", "Memory/RAM/process_rss_GB", "Monitor/epoch_gpu_peak_MB",
                           "Monitor/Operation/load_cpu_delta_MB"}
    # the old epoch tag held the peak RSS on CPU runs: read as what it was
    assert tags["cpu"] == {"Memory/RAM/process_rss_GB", "Monitor/epoch_cpu_peak_rss_MB", "System/ram_used_GB"}
    assert {s.run: s.peak_allocated_gb for s in summarize(df)} == {"cpu": None, "gpu": 1.5}
