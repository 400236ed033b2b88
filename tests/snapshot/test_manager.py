"""SnapshotManager inside a real CPU training loop with MemoryWriter."""

from __future__ import annotations

import errno
import gzip
import json
import os

import pytest
import torch

from tbmem import MemoryWriter
from tbmem._internal._torch_private import OutOfMemoryError
from tbmem._internal.snapshot import SnapshotConfig, load_snapshot
from tbmem._internal.snapshot.manager import FILES_TAG
from tbmem._internal.snapshot.store import PLUGIN_DIR
from tests._events import scalars, texts
from tests.snapshot._helpers import native_module


def _train(writer, steps, fail_at=None, exc=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    writer.watch(model, opt)
    for step in range(steps):
        with writer.monitored_step(step):
            loss = model(torch.randn(16, 32)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            if step == fail_at:
                raise exc
    return model


def _files(logdir):
    folder = os.path.join(logdir, PLUGIN_DIR)
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


def test_cpu_training_writes_files_text_and_scalars(tmp_path):
    cfg = SnapshotConfig(every=4, window=2, max_snapshots=0)
    with MemoryWriter(tmp_path, every=1, census_every=0, snapshot=cfg) as writer:
        _train(writer, 9)
    # windows start at due steps 0, 4, 8; the one at 8 is still open at close and discarded
    assert _files(tmp_path) == [f"snapshot_rank0_step{s:09d}.{ext}" for s in (0, 4) for ext in ("html", "json.gz")]
    events = scalars(tmp_path, "Snapshot/events")
    sizes = scalars(tmp_path, "Snapshot/file_MB")
    # written at the end of each window, reported at the window's first step (as the file name)
    assert [s for s, _ in events] == [0, 4] and [s for s, _ in sizes] == [0, 4]
    for (step, n), (_, mb) in zip(events, sizes):
        path = tmp_path / PLUGIN_DIR / f"snapshot_rank0_step{step:09d}.json.gz"
        snap = load_snapshot(path)
        assert n == snap.n_events > 0
        assert mb == pytest.approx(os.path.getsize(path) / 2**20)
        # the window records two optimizer steps: parameters/gradients/momentum are named
        assert {"parameter", "optimizer_state", "activation", "backward"} <= set(snap.categories)
    summary = dict(texts(tmp_path, FILES_TAG + "/text_summary"))
    assert sorted(summary) == [0, 4]
    assert str(tmp_path / PLUGIN_DIR / "snapshot_rank0_step000000004.html") in summary[4]
    assert f"{events[1][1]:.0f} events" in summary[4]


def test_continuous_recording_stacks_point_at_the_training_code(tmp_path):
    cfg = SnapshotConfig(steps=(3,), html=False)
    with MemoryWriter(tmp_path, every=10, census_every=0, snapshot=cfg) as writer:
        _train(writer, 5)
    snap = load_snapshot(tmp_path / PLUGIN_DIR / "snapshot_rank0_step000000003.json.gz")
    here = os.path.abspath(__file__)
    files = {snap.strings[f[0]] for f in snap.frames}
    assert here in files
    # 4 steps recorded (0..3): each forward allocates the first Linear's (16, 64) output
    act = [i for i in range(snap.n_allocs) if snap.allocs["size"][i] == 16 * 64 * 4
           and snap.categories[snap.allocs["category"][i]] == "activation"]
    assert len(act) >= 4


def test_oom_in_monitored_step_writes_snapshot_and_reraises(tmp_path):
    exc = OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
    cfg = SnapshotConfig(start_step=1, every=100, max_snapshots=1)
    writer = MemoryWriter(tmp_path, every=100, census_every=0, snapshot=cfg)
    with pytest.raises(OutOfMemoryError) as info:
        _train(writer, 5, fail_at=2, exc=exc)
    assert info.value is exc
    assert _files(tmp_path) == ["oom_rank0_step000000002.html", "oom_rank0_step000000002.json.gz"]
    # events are flushed before the exception leaves monitored_step: readable without close()
    assert [s for s, _ in scalars(tmp_path, "Snapshot/events")] == [2]
    assert "oom_rank0_step000000002.html" in texts(tmp_path, FILES_TAG + "/text_summary")[0][1]
    snap = load_snapshot(tmp_path / PLUGIN_DIR / "oom_rank0_step000000002.json.gz")
    assert snap.kind == "oom" and "20.00 GiB" in snap.meta["exception"]
    assert snap.n_events > 0
    writer.close()


def test_unwritable_folder_drops_snapshots_with_one_line_training_continues(tmp_path, tbmem_log):
    (tmp_path / "plugins").write_text("a file where the folder should be")
    cfg = SnapshotConfig(every=2, html=False)
    with MemoryWriter(tmp_path, every=1, census_every=0, snapshot=cfg) as writer:
        _train(writer, 7)
    msgs = [r.getMessage() for r in tbmem_log.records]
    assert len(msgs) == 2, msgs  # the cause once, the count at close
    assert "cannot write to" in msgs[0] and "plugins" in msgs[0] and "training continues" in msgs[0]
    # due at 0, 2, 4, 6: the first fails, the others are skipped or retried; none is written
    assert "4 memory snapshots could not be written" in msgs[1]
    assert [s for s, _ in scalars(tmp_path, "Memory/RAM/process_rss_GB")] == list(range(7))


def test_full_disk_drops_snapshots_and_leaves_no_temp(tmp_path, tbmem_log, monkeypatch):
    real_link = os.link

    def full(src, dst):
        if "plugins" in str(dst):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_link(src, dst)

    monkeypatch.setattr(os, "link", full)
    cfg = SnapshotConfig(every=2, html=True)
    with MemoryWriter(tmp_path, every=1, census_every=0, snapshot=cfg) as writer:
        _train(writer, 5)
    assert _files(tmp_path) == []  # no final file and no temp file
    msgs = [r.getMessage() for r in tbmem_log.records]
    assert len(msgs) == 2 and "No space left" in msgs[0]
    assert "3 memory snapshots could not be written" in msgs[1] and "No space left" in msgs[1]


@pytest.mark.parametrize("recorder", ["dispatch", "allocator"])
def test_recorder_left_after_close(tmp_path, recorder):
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    mod = native_module() if recorder == "allocator" else None
    cfg = SnapshotConfig(every=3, recorder=recorder)
    with MemoryWriter(tmp_path, every=1, census_every=0, snapshot=cfg) as writer:
        _train(writer, 2)
        if mod is None:
            assert _get_current_dispatch_mode() is not None
        else:
            assert _get_current_dispatch_mode() is None and mod.thread_recordings() == [True]
    assert _get_current_dispatch_mode() is None
    assert mod is None or mod.thread_recordings() == []
    with gzip.open(tmp_path / PLUGIN_DIR / "snapshot_rank0_step000000000.json.gz", "rt") as fh:
        assert json.load(fh)["schema"] == "tbmem.snapshot"


def test_step_and_phase_markers_reach_the_snapshot(tmp_path):
    import tbmem._internal.snapshot.markers as markers_mod
    from tbmem._internal.snapshot.markers import mark

    markers_mod._explicit_steps = False  # earlier tests in this process may have marked their own steps
    cfg = SnapshotConfig(steps=(3,), html=False)
    with MemoryWriter(tmp_path, every=10, census_every=0, snapshot=cfg) as writer:
        _train(writer, 5)
    snap = load_snapshot(tmp_path / PLUGIN_DIR / "snapshot_rank0_step000000003.json.gz")
    labels = [m["label"] for m in snap.main.markers if m["kind"] == "step"]
    assert labels[:3] == ["after step 0", "after step 1", "after step 2"]  # where log_memory(step) ran
    # a caller that marks its own steps replaces the automatic marks
    try:
        cfg = SnapshotConfig(steps=(2,), html=False)
        with MemoryWriter(tmp_path / "b", every=10, census_every=0, snapshot=cfg) as writer:
            model = torch.nn.Linear(8, 8)
            for step in range(3):
                mark(f"step {step}")
                with writer.monitored_step(step):
                    mark("forward", kind="phase")
                    loss = model(torch.randn(4, 8)).sum()
                    mark("backward", kind="phase")
                    loss.backward()
        snap = load_snapshot(tmp_path / "b" / PLUGIN_DIR / "snapshot_rank0_step000000002.json.gz")
        kinds = [(m["kind"], m["label"]) for m in snap.main.markers]
        assert ("step", "step 1") in kinds and ("phase", "backward") in kinds
        assert not any(label.startswith("after step") for _k, label in kinds)
    finally:
        markers_mod._explicit_steps = False
