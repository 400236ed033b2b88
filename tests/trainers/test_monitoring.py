"""TrainerMonitoring's per-step hooks: snapshot markers made only while a recorder records."""

from __future__ import annotations

import pytest
import torch

from tbmem import MemoryWriterConfig
from tbmem._internal.snapshot import SnapshotConfig, load_snapshot
from tbmem._internal.snapshot.store import PLUGIN_DIR
from trainers.monitoring import TrainerMonitoring

STEP = [("step", "step {}"), ("phase", "forward"), ("phase", "backward"), ("phase", "optimizer")]


def _marks(first: int, last: int) -> list[tuple[str, str]]:
    return [(kind, label.format(s)) for s in range(first, last + 1) for kind, label in STEP]


@pytest.mark.parametrize("census_at, expected", [
    # the record (where a window opens and closes) comes after the optimizer: whole steps
    ("after_backward", {0: _marks(0, 1), 4: _marks(4, 5)}),
    # the record comes before backward: a window opens and closes between forward and backward
    ("before_backward", {0: _marks(0, 1)[:-2], 4: _marks(3, 5)[2:-2]}),
])
def test_snapshot_windows_hold_every_mark_the_hooks_made_while_recording(tmp_path, census_at, expected):
    import tbmem._internal.snapshot.markers as markers

    markers._explicit_steps = False  # earlier tests in this process may have marked their own steps
    cfg = MemoryWriterConfig(every=1, census_every=0,
                             snapshot=SnapshotConfig(every=4, window=2, html=False, pickle=False))
    mon = TrainerMonitoring.create(tmp_path, enabled=True, verbose_batches=0, tbmem_config=cfg,
                                   census_at=census_at)
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        for step in range(8):  # as SyntheticTrainer calls the hooks
            mon.on_batch_start(step, step)
            loss = model(torch.randn(4, 8)).pow(2).sum()
            if mon.mid_step_hooks:
                mon.before_backward(step, loss)
            loss.backward()
            if mon.mid_step_hooks:
                mon.before_optimizer(step)
            opt.step()
            mon.before_zero_grad(step, loss)
            opt.zero_grad()
            mon.on_batch_end(step, loss.item())
        mon.close()
        found = {}
        for path in sorted((tmp_path / PLUGIN_DIR).glob("snapshot_*.json.gz")):
            step = int(path.name.split("step")[1].split(".")[0])
            found[step] = [(m["kind"], m["label"]) for m in load_snapshot(path).main.markers]
        # no automatic "after step N" marks either: the trainer marks its own steps
        assert found == expected
    finally:
        markers._explicit_steps = False


def test_mid_step_hooks_are_needed_only_while_recording_or_for_a_record_before_backward(tmp_path):
    for census_at, expected in (("after_backward", False), ("before_backward", True)):
        mon = TrainerMonitoring.create(tmp_path / census_at, enabled=True, verbose_batches=0,
                                       tbmem_config=MemoryWriterConfig(every=1, census_every=0), census_at=census_at)
        try:
            mon.on_batch_start(0, 0)
            assert mon.mid_step_hooks is expected
            assert mon.writer.last_step == 0
        finally:
            mon.close()


@pytest.mark.parametrize("census_at", ["after_backward", "before_backward"])
def test_the_hooks_call_log_memory_only_where_begin_step_says_it_is_due(tmp_path, census_at):
    from tests._events import scalars

    cfg = MemoryWriterConfig(every=4, census_every=6, custom_layout=False,
                             profile={"every": 5, "steps": 2, "start": 5, "max_windows": 1})
    mon = TrainerMonitoring.create(tmp_path, enabled=True, verbose_batches=0, tbmem_config=cfg, census_at=census_at)
    logged, real = [], mon.writer.log_memory
    mon.writer.log_memory = lambda step, **kw: (logged.append(step), real(step, **kw))[1]
    model = torch.nn.Linear(8, 8)
    try:
        for step in range(14):
            mon.on_batch_start(step, step)
            loss = model(torch.randn(4, 8)).pow(2).sum()
            if mon.mid_step_hooks:
                mon.before_backward(step, loss)
            loss.backward()
            mon.before_zero_grad(step, loss)
            model.zero_grad()
    finally:
        mon.close()
    # the record's steps, the census's, the step before the profile window (it opens there) and the window's
    assert logged == [0, 4, 5, 6, 8, 12]
    assert [s for s, _ in scalars(tmp_path, "Memory/RAM/process_rss_GB")] == [0, 4, 5, 6, 8, 12]
    assert [s for s, _ in scalars(tmp_path, "Memory/Tensor_Census/total_MB")] == [0, 5, 6, 12]  # a census each window step


def test_an_out_of_memory_error_in_a_synthetic_step_saves_its_snapshot_and_leaves_train_unchanged(
        compose, tmp_path, monkeypatch, caplog):
    import trainers.synthetic as synthetic
    from tests._events import scalars
    from trainers.experiment import run_experiment

    real, calls, raised = synthetic.rollout_loss, [0], torch.OutOfMemoryError("CUDA out of memory (a test)")

    def rollout_loss(*args, **kwargs):
        calls[0] += 1
        if calls[0] == 8:  # step 7: not a due step of every=5
            raise raised
        return real(*args, **kwargs)

    monkeypatch.setattr(synthetic, "rollout_loss", rollout_loss)
    cfg = compose("burgers_quick_test", "trainer=synthetic_with_memory", "trainer_params.epochs=1",
                  "tbmem.every=5", "tbmem.census_every=0", "tbmem.snapshot.every=0")
    with pytest.raises(torch.OutOfMemoryError) as info:
        run_experiment(cfg, log_dir=tmp_path / "run")
    assert info.value is raised and info.value.__context__ is None
    raised.__traceback__ = None  # its frames hold the trainer: later tests' censuses would count its model
    assert [s for s, _ in scalars(tmp_path / "run", "Memory/RAM/process_rss_GB")] == [0, 5, 7]  # + the OOM record
    oom = sorted((tmp_path / "run" / PLUGIN_DIR).glob("oom_*.json.gz"))
    assert [p.name for p in oom] == ["oom_rank0_step000000007.json.gz"]
    assert load_snapshot(oom[0]).main.n_allocs > 0  # no window was recording: the memory alive at the error
    assert any("out of memory at step 7" in r.getMessage() for r in caplog.records)
