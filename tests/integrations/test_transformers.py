"""tbmem.integrations.transformers.MemoryCallback inside a real transformers.Trainer (tiny GPT-2, CPU)."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from tbmem.integrations.transformers import WHERE, MemoryCallback, MemoryTrainerMixin
from tests.integrations._closes import Closes, is_open
from tests.integrations._counts import (
    CATEGORIES,
    censuses,
    count,
    run_dirs,
    scalar_steps,
)

pytestmark = [pytest.mark.filterwarnings("ignore::FutureWarning"), pytest.mark.filterwarnings("ignore::UserWarning")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")


class _Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int = 64) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randint(0, 100, (n, 16), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.x[i], "labels": self.x[i]}


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=16,
                                  bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg)


class _Counter(transformers.TrainerCallback):
    """The test's own count, in the same hook, right after MemoryCallback's census."""

    def __init__(self) -> None:
        self.at: dict[int, dict[str, int]] = {}

    def on_optimizer_step(self, args, state, control, model=None, optimizer=None, **kw):
        self.at[state.global_step + 1] = count(model, optimizer)


def _train(tmp_path: Path, callbacks: list, *, report_to: str = "tensorboard", accumulation: int = 2,
           steps: int = 6, trainer_class: type = transformers.Trainer, model=None, before_train=None, **kw):
    gc.collect()  # the census counts every parameter alive: the previous test's model must be gone
    args = transformers.TrainingArguments(
        str(tmp_path / "out"), per_device_train_batch_size=4, gradient_accumulation_steps=accumulation,
        max_steps=steps, logging_steps=1, report_to=report_to, use_cpu=True, save_strategy="no",
        optim="adamw_torch_fused", disable_tqdm=True, **kw)
    trainer = trainer_class(model=model or _model(), args=args, train_dataset=_Tokens(), callbacks=callbacks)
    if before_train is not None:
        before_train(trainer)
    trainer.train()
    return trainer


def test_every_census_is_the_tests_own_count_on_the_trainers_loss_steps(tmp_path):
    counter = _Counter()
    _train(tmp_path, [MemoryCallback(census_every=2, every=1), counter])
    (run,) = run_dirs(tmp_path)  # one run: the Trainer's own TensorBoard folder
    assert run.parent.name == "runs"
    found = censuses(run)
    # accumulation of 2: one census per optimizer step that is due, none mid-accumulation
    assert sorted(found) == [2, 4, 6]
    for step, census in found.items():
        assert {c: census["by_category"][c] for c in CATEGORIES} == counter.at[step], step
        assert census["by_category"]["gradients"] > 0  # not after zero_grad (the on_step_end trap)
        assert census["where"] == WHERE
        # the adapters' module depth (2): GPT-2's parts, not one bar for model.transformer (lm_head is wte's)
        assert set(census["by_module"]) == {f"model.transformer.{m}" for m in ("wte", "wpe", "h", "ln_f")}
    loss_steps = scalar_steps(run, "train/loss")
    assert loss_steps == [1, 2, 3, 4, 5, 6]
    assert set(found) <= set(loss_steps)
    assert set(scalar_steps(run, "Memory/RAM/process_rss_GB")) == set(loss_steps)


class _Writers(transformers.TrainerCallback):
    """After MemoryCallback: at each of its events, whether the Trainer's TensorBoard writer and its own are open."""

    def __init__(self, memory: MemoryCallback) -> None:
        self.memory, self.tensorboard, self.open = memory, None, []
        self.theirs = self.ours = None

    def on_train_begin(self, args, state, control, **kw):
        self.theirs, self.ours = self.tensorboard.tb_writer, self.memory.writer

    def _look(self, event):
        self.open.append((event, is_open(self.tensorboard.tb_writer), is_open(self.memory.writer)))

    def on_optimizer_step(self, args, state, control, **kw):
        self._look("on_optimizer_step")

    def on_log(self, args, state, control, **kw):
        self._look("on_log")

    def on_step_end(self, args, state, control, **kw):
        self._look("on_step_end")


def test_no_writer_is_closed_before_its_owner_closes_it(tmp_path, monkeypatch):
    closes = Closes(monkeypatch)
    memory = MemoryCallback(census_every=2, every=1)
    writers = _Writers(memory)

    def find_tensorboard(trainer):
        (writers.tensorboard,) = [cb for cb in trainer.callback_handler.callbacks
                                  if isinstance(cb, transformers.integrations.TensorBoardCallback)]

    _train(tmp_path, [memory, writers], before_train=find_tensorboard)
    # 6 steps of three events each, and the Trainer's closing log (train_runtime, ...) just before train end
    assert len(writers.open) == 6 * 3 + 1 and writers.open[-1][0] == "on_log" and all(theirs and ours for _, theirs, ours in writers.open), writers.open
    # the Trainer's writer: closed once, by its own TensorBoardCallback at train end, never by tbmem
    (closer,) = closes.of(writers.theirs)
    assert "transformers" in closer and "tbmem" not in closer
    assert writers.ours is not writers.theirs and writers.ours.closed and memory.writer is None


def test_without_tensorboard_its_own_run_beside_the_output_holds_the_trainers_loss(tmp_path):
    _train(tmp_path, [MemoryCallback(census_every=3, every=3)], report_to="none", accumulation=1)
    (run,) = run_dirs(tmp_path)
    assert run == tmp_path / "out" / "tbmem"
    assert sorted(censuses(run)) == [3, 6]
    assert scalar_steps(run, "train/loss") == [1, 2, 3, 4, 5, 6]


def test_follow_logging_records_at_the_logging_steps(tmp_path):
    _train(tmp_path, [MemoryCallback(census_every=4, follow_logging=True)], accumulation=1, steps=8,
           logging_strategy="steps")
    (run,) = run_dirs(tmp_path)
    assert scalar_steps(run, "Memory/RAM/process_rss_GB") == scalar_steps(run, "train/loss")


class _Boom(torch.nn.Module):
    """Raises torch's out-of-memory error in forward at the third forward."""

    def __init__(self, inner: torch.nn.Module, at: int) -> None:
        super().__init__()
        self.inner, self.calls, self.at = inner, 0, at

    def forward(self, input_ids=None, labels=None):
        self.calls += 1
        if self.calls == self.at:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (test)")
        return self.inner(input_ids=input_ids, labels=labels)


def test_an_out_of_memory_error_in_forward_reaches_the_user_after_the_record(tmp_path, caplog):
    cb = MemoryCallback(census_every=1, every=1)
    with pytest.raises(torch.OutOfMemoryError, match="test"):
        _train(tmp_path, [cb], accumulation=1, model=_Boom(_model(), at=3))
    (run,) = run_dirs(tmp_path)
    assert 3 in scalar_steps(run, "Memory/RAM/process_rss_GB")  # the record of the failing step
    assert "out of memory" in caplog.text.lower()
    assert cb.writer is not None and not cb.writer.closed  # no on_train_end after an error, without the mixin
    cb.on_train_end(None, None, None)  # what the mixin does as train() leaves: the writer closed, the hook off
    assert cb.writer is None and cb._hook is None


class _Trainer(MemoryTrainerMixin, transformers.Trainer):
    pass


def test_the_mixin_hands_an_error_in_backward_to_the_callback(tmp_path):
    calls: list[tuple[int, BaseException]] = []
    cb = MemoryCallback(census_every=1)
    cb.step_failed = lambda step, exc: calls.append((step, exc))  # type: ignore[method-assign]
    boom = RuntimeError("in backward")

    class Failing(_Trainer):
        def compute_loss(self, *a, **k):
            loss = super().compute_loss(*a, **k)
            if self.state.global_step == 1:
                raise boom
            return loss

    with pytest.raises(RuntimeError) as got:
        _train(tmp_path, [cb], accumulation=1, trainer_class=Failing)
    # handed over in training_step, and again as it leaves train (where an optimizer step's error is caught)
    assert got.value is boom and calls == [(2, boom), (2, boom)]
    assert cb.writer is None  # train ended with the error: the mixin closed the callback's writer


def test_the_callback_takes_an_error_once():
    class Writer:
        def __init__(self) -> None:
            self.failed: list[tuple[int, BaseException]] = []

        def step_failed(self, step, exc):
            self.failed.append((step, exc))

    cb, oom = MemoryCallback(), torch.OutOfMemoryError("CUDA out of memory (test)")
    cb.writer = Writer()
    for _ in range(3):  # the forward hook, training_step, train
        cb.step_failed(4, oom)
    assert cb.writer.failed == [(4, oom)]
