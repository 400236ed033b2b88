"""tbmem.integrations.lightning.MemoryCallback inside a real Lightning Trainer (both packages), CPU."""

from __future__ import annotations

import gc
import importlib

import pytest
import torch

pytest.importorskip("lightning")

from tbmem.integrations.lightning import WHERE, WHERE_ACTIVATIONS, MemoryCallback
from tests.integrations._closes import Closes, is_open
from tests.integrations._counts import (
    CATEGORIES,
    censuses,
    count,
    run_dirs,
    scalar_steps,
)
from tests.integrations._lit import module_class

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"), pytest.mark.filterwarnings("ignore::FutureWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]
PACKAGES = ["lightning.pytorch", "pytorch_lightning"]


def _counter(pl):
    class Counter(pl.Callback):
        """The test's own count, in the same hook, right after MemoryCallback's census."""

        def __init__(self) -> None:
            self.at: dict[int, dict[str, int]] = {}
            self.before = 0

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.before = trainer.global_step

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step != self.before:
                self.at[trainer.fit_loop.epoch_loop._batches_that_stepped] = count(pl_module, trainer.optimizers[0])

    return Counter()


def _fit(pl, tmp_path, callbacks, *, logger=True, steps=6, fail_at=None, optimizer=None, log_every_n_steps=1, **kw):
    gc.collect()  # the census counts every parameter alive: the previous test's model must be gone
    if logger:
        logger = pl.loggers.TensorBoardLogger(str(tmp_path), name="lit")
    trainer = pl.Trainer(max_steps=steps, accumulate_grad_batches=2, log_every_n_steps=log_every_n_steps, logger=logger,
                         callbacks=callbacks, accelerator="cpu", devices=1, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp_path),
                         **kw)
    trainer.fit(module_class(pl)(fail_at=fail_at, optimizer=optimizer))
    return trainer


@pytest.mark.parametrize("package", PACKAGES)
def test_every_census_is_the_tests_own_count_on_lightnings_loss_steps(tmp_path, package):
    pl = importlib.import_module(package)
    counter = _counter(pl)
    cb = MemoryCallback(census_every=2, every=1)
    assert isinstance(cb, pl.Callback)
    _fit(pl, tmp_path, [cb, counter])
    (run,) = run_dirs(tmp_path)  # the TensorBoardLogger's own version folder
    assert run == tmp_path / "lit" / "version_0"
    found = censuses(run)
    assert sorted(found) == [0, 2, 4]  # accumulation of 2 over 12 batches: 6 optimizer steps, logged as 0..5
    for step, census in found.items():
        assert {c: census["by_category"][c] for c in CATEGORIES} == counter.at[step], step
        assert census["by_category"]["gradients"] > 0 and census["by_category"]["buffers"] > 0
        assert census["where"] == WHERE
        assert set(census["by_module"]) == {"model.net.0", "model.net.1", "model.net.3"}  # inside self.net
    loss_steps = scalar_steps(run, "train_loss")
    assert loss_steps == [0, 1, 2, 3, 4, 5]
    assert set(scalar_steps(run, "Memory/RAM/process_rss_GB")) == set(loss_steps)


def test_activation_census_between_forward_and_backward(tmp_path):
    import lightning.pytorch as pl

    _fit(pl, tmp_path, [MemoryCallback(census_every=2, activations=True)])
    (run,) = run_dirs(tmp_path)
    found = censuses(run)
    assert sorted(found) == [0, 2, 4]
    for census in found.values():
        assert census["where"] == WHERE_ACTIVATIONS
        assert census["by_category"]["activations"] > 0


def test_no_writer_is_closed_before_its_owner_closes_it(tmp_path, monkeypatch):
    import lightning.pytorch as pl

    closes = Closes(monkeypatch)
    memory = MemoryCallback(census_every=2, every=1)

    class Writers(pl.Callback):
        """After MemoryCallback: at each batch end, whether the logger's writer and tbmem's are open. It holds
        no callback in a closure: Lightning binds the module's ``log`` onto every callback it runs."""

        def __init__(self, memory: MemoryCallback) -> None:
            self.memory, self.open, self.ours = memory, [], None

        def on_train_start(self, trainer, pl_module):
            self.ours = self.memory.writer

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.open.append((is_open(trainer.logger.experiment), is_open(self.memory.writer)))

    writers = Writers(memory)
    trainer = _fit(pl, tmp_path, [memory, writers])
    assert len(writers.open) == 12 and all(theirs and ours for theirs, ours in writers.open), writers.open
    # the logger's writer: closed by Lightning as it finalizes the logger at the end of fit, never by tbmem
    closers = closes.of(trainer.logger.experiment)
    assert closers and all("lightning" in c and "tbmem" not in c for c in closers), closers
    assert writers.ours is not trainer.logger.experiment and writers.ours.closed and memory.writer is None


def test_without_a_tensorboard_logger_its_own_run_holds_the_loss(tmp_path):
    import lightning.pytorch as pl

    _fit(pl, tmp_path, [MemoryCallback(census_every=3, every=1)], logger=False)
    (run,) = run_dirs(tmp_path)
    assert run == tmp_path / "tbmem"
    assert sorted(censuses(run)) == [0, 3]
    assert scalar_steps(run, "train_loss") == [0, 1, 2, 3, 4, 5]


def test_an_out_of_memory_error_reaches_the_user_after_the_record(tmp_path, caplog):
    import lightning.pytorch as pl

    with pytest.raises(torch.OutOfMemoryError, match="test"):
        _fit(pl, tmp_path, [MemoryCallback(census_every=0, every=1)], fail_at=2)
    (run,) = run_dirs(tmp_path)
    assert scalar_steps(run, "Memory/RAM/process_rss_GB") == [0, 1, 2]  # 2: the record at the error
    assert "out of memory" in caplog.text.lower()


def test_follow_logging_records_at_lightnings_logging_steps(tmp_path):
    import lightning.pytorch as pl

    _fit(pl, tmp_path, [MemoryCallback(census_every=4, follow_logging=True)], steps=8, log_every_n_steps=3)
    (run,) = run_dirs(tmp_path)
    assert scalar_steps(run, "train_loss") == [2, 5]  # Lightning logs where (step + 1) % 3 == 0
    assert scalar_steps(run, "Memory/RAM/process_rss_GB") == [0, 2, 4, 5]  # there, and at the censuses (0, 4)
    assert sorted(censuses(run)) == [0, 4]
