"""tbmem.integrations.accelerate.MemoryTracker in a real accelerate loop (bf16 autocast, accumulation), CPU."""

from __future__ import annotations

import gc

import pytest
import torch

accelerate = pytest.importorskip("accelerate")

from tbmem.integrations.accelerate import WHERE, MemoryTracker
from tests.integrations._closes import Closes, is_open
from tests.integrations._counts import (
    CATEGORIES,
    censuses,
    count,
    run_dirs,
    scalar_steps,
)

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"), pytest.mark.filterwarnings("ignore::FutureWarning")]


def _loop(tmp_path, tracker, *, batches=12, accumulation=2, fail_at=None, optimizer=None):
    gc.collect()  # the census counts every parameter alive: the previous test's model must be gone
    # a Trainer earlier in this process set accelerate's process-wide state up without bf16
    accelerate.state.AcceleratorState._reset_state(reset_partial_state=True)
    accelerator = accelerate.Accelerator(log_with=[tracker], gradient_accumulation_steps=accumulation,
                                         mixed_precision="bf16", cpu=True)
    accelerator.init_trackers("tiny")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 1))
    optimizer = (optimizer or (lambda params: torch.optim.AdamW(params, lr=1e-3)))(model.parameters())
    data = torch.utils.data.TensorDataset(torch.randn(8 * batches, 8), torch.randn(8 * batches, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    counts: dict[int, dict[str, int]] = {}
    step = 0
    for x, y in loader:
        with accelerator.accumulate(model):
            try:
                if step == fail_at:
                    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (test)")
                loss = torch.nn.functional.mse_loss(model(x).float(), y)
                accelerator.backward(loss)
                optimizer.step()
                if tracker.after_step(accelerator, step):
                    counts[step] = count(model, optimizer)
                optimizer.zero_grad()
            except BaseException as exc:
                tracker.step_failed(step, exc)
                raise
        if accelerator.sync_gradients:
            accelerator.log({"loss": loss.item()}, step=step)
            step += 1
    accelerator.end_training()
    return counts


def test_every_census_is_the_tests_own_count_on_the_loops_loss_steps(tmp_path):
    counts = _loop(tmp_path, MemoryTracker(tmp_path / "run", census_every=2, every=1))
    (run,) = run_dirs(tmp_path)
    assert run == tmp_path / "run"
    found = censuses(run)
    assert sorted(found) == [0, 2, 4]  # 12 batches, accumulation of 2: 6 optimizer steps
    for step, census in found.items():
        assert {c: census["by_category"][c] for c in CATEGORIES} == counts[step], step
        assert census["by_category"]["gradients"] > 0 and census["by_category"]["optimizer_state"] > 0
        assert census["where"] == WHERE
        assert set(census["by_module"]) == {"model.0", "model.1", "model.3"}
    assert scalar_steps(run, "loss") == [0, 1, 2, 3, 4, 5]
    assert scalar_steps(run, "Memory/RAM/process_rss_GB") == [0, 1, 2, 3, 4, 5]


def test_the_tracker_is_what_get_tracker_unwraps(tmp_path):
    tracker = MemoryTracker(tmp_path / "run")
    accelerator = accelerate.Accelerator(log_with=[tracker], cpu=True)
    accelerator.init_trackers("tiny", config={"lr": 0.001})
    assert accelerator.get_tracker("tbmem", unwrap=True) is tracker.writer
    accelerator.end_training()
    assert tracker.writer.closed


def test_no_writer_is_closed_before_its_owner_closes_it(tmp_path, monkeypatch):
    closes = Closes(monkeypatch)
    accelerate.state.AcceleratorState._reset_state(reset_partial_state=True)
    tracker = MemoryTracker(tmp_path / "run", census_every=2, every=1)
    accelerator = accelerate.Accelerator(log_with=["tensorboard", tracker], project_dir=str(tmp_path / "acc"),
                                         cpu=True)
    accelerator.init_trackers("tiny")
    theirs = accelerator.get_tracker("tensorboard", unwrap=True)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.AdamW(model.parameters())
    model, optimizer = accelerator.prepare(model, optimizer)
    seen = []
    for step in range(4):
        accelerator.backward(model(torch.randn(4, 8)).sum())
        optimizer.step()
        tracker.after_step(accelerator, step)
        optimizer.zero_grad()
        accelerator.log({"loss": 1.0 / (step + 1)}, step=step)
        seen.append((is_open(theirs), is_open(tracker.writer)))
    ours = tracker.writer
    accelerator.end_training()
    assert seen == [(True, True)] * 4
    # accelerate's TensorBoard writer: closed by its own tracker at end_training, never by tbmem's
    (closer,) = closes.of(theirs)
    assert "accelerate" in closer and "tbmem" not in closer
    assert ours is not theirs and ours.closed
    # both trackers were given every value
    assert scalar_steps(tmp_path / "run", "loss") == scalar_steps(tmp_path / "acc" / "tiny", "loss") == [0, 1, 2, 3]


def test_an_out_of_memory_error_reaches_the_user_after_the_record(tmp_path, caplog):
    with pytest.raises(torch.OutOfMemoryError, match="test"):
        _loop(tmp_path, MemoryTracker(tmp_path / "run", census_every=0, every=1), fail_at=2)
    assert scalar_steps(tmp_path / "run", "Memory/RAM/process_rss_GB") == [0, 1, 2]
    assert "out of memory" in caplog.text.lower()
