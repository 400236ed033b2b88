"""An out-of-memory error inside the framework's optimizer step, on a fake CUDA device (tests/fake_cuda.py): the
snapshot and the record are written, then the same exception object reaches the user."""

from __future__ import annotations

import gc
import importlib
from pathlib import Path

import pytest
import torch

from tbmem._internal.logdir.layout import PLUGIN_DIR
from tbmem._internal.snapshot import load_snapshot
from tests.fake_cuda import FakeCuda, install_fake_cuda
from tests.integrations._counts import run_dirs, scalar_steps
from tests.snapshot._helpers import torch_dict

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"), pytest.mark.filterwarnings("ignore::FutureWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]
MESSAGE = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 80.00 GiB of which "
           "1.00 MiB is free. (test)")
SNAPSHOT = {"html": False, "pickle": False}  # no scheduled snapshot: the out-of-memory one only


class _FailingAdamW(torch.optim.AdamW):
    """AdamW whose ``at``-th step finds the (fake) CUDA device out of memory."""

    def __init__(self, params, *, at: int, error: BaseException, monkeypatch: pytest.MonkeyPatch) -> None:
        super().__init__(params, lr=1e-3)
        self.at, self.error, self.monkeypatch, self.calls = at, error, monkeypatch, 0

    def step(self, closure=None):
        self.calls += 1
        if self.calls == self.at:
            # the device appears only now: the frameworks ran on the CPU until here
            install_fake_cuda(self.monkeypatch, FakeCuda(free=2**20))
            self.monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda *a, **k: torch_dict())
            self.monkeypatch.setattr(torch.cuda, "memory_snapshot", lambda *a, **k: torch_dict()["segments"])
            raise self.error
        return super().step(closure)


def _check(run: Path, step: int, caplog) -> None:
    (path,) = sorted((run / PLUGIN_DIR).glob("oom_rank0_step*.json.gz"))
    snap = load_snapshot(path)
    assert (snap.kind, snap.step) == ("oom", step) and "(test)" in snap.meta["exception"]
    assert step in scalar_steps(run, "Memory/RAM/process_rss_GB")  # the record at the failing step
    assert f"out of memory at step {step}" in caplog.text


def test_hugging_face_trainer(tmp_path, monkeypatch, caplog):
    transformers = pytest.importorskip("transformers")
    from tbmem.integrations.transformers import MemoryCallback, MemoryTrainerMixin
    from tests.integrations.test_transformers import _model, _Tokens

    class Trainer(MemoryTrainerMixin, transformers.Trainer):
        pass

    gc.collect()
    error = torch.OutOfMemoryError(MESSAGE)
    model = _model()
    optimizer = _FailingAdamW(model.parameters(), at=3, error=error, monkeypatch=monkeypatch)
    args = transformers.TrainingArguments(str(tmp_path / "out"), per_device_train_batch_size=4, max_steps=6,
                                          gradient_accumulation_steps=2, logging_steps=1, report_to="tensorboard",
                                          use_cpu=True, save_strategy="no", disable_tqdm=True)
    callback = MemoryCallback(census_every=0, every=1, snapshot=SNAPSHOT)
    trainer = Trainer(model=model, args=args, train_dataset=_Tokens(), callbacks=[callback],
                      optimizers=(optimizer, None))
    with pytest.raises(torch.OutOfMemoryError) as got:
        trainer.train()
    assert got.value is error
    (run,) = run_dirs(tmp_path)
    _check(run, 3, caplog)  # optimizer step 3, logged by the Trainer at global_step + 1
    assert callback.writer is None  # closed by the mixin: on_train_end does not come after an error
    assert not model._forward_hooks  # the callback's forward hook is off the user's model again


@pytest.mark.parametrize("package", ["lightning.pytorch", "pytorch_lightning"])
def test_lightning(tmp_path, monkeypatch, caplog, package):
    pytest.importorskip(package.split(".")[0])
    pl = importlib.import_module(package)
    from tbmem.integrations.lightning import MemoryCallback
    from tests.integrations.test_lightning import _fit

    error = torch.OutOfMemoryError(MESSAGE)
    with pytest.raises(torch.OutOfMemoryError) as got:
        _fit(pl, tmp_path, [MemoryCallback(census_every=0, every=1, snapshot=SNAPSHOT)],
             optimizer=lambda params: _FailingAdamW(params, at=3, error=error, monkeypatch=monkeypatch))
    assert got.value is error
    (run,) = run_dirs(tmp_path)
    _check(run, 2, caplog)  # the third optimizer step: Lightning logs it at step 2


def test_accelerate(tmp_path, monkeypatch, caplog):
    pytest.importorskip("accelerate")
    from tbmem.integrations.accelerate import MemoryTracker
    from tests.integrations.test_accelerate import _loop

    error = torch.OutOfMemoryError(MESSAGE)
    tracker = MemoryTracker(tmp_path / "run", census_every=0, every=1, snapshot=SNAPSHOT)
    with pytest.raises(torch.OutOfMemoryError) as got:
        _loop(tmp_path, tracker,
              optimizer=lambda params: _FailingAdamW(params, at=3, error=error, monkeypatch=monkeypatch))
    assert got.value is error
    _check(tmp_path / "run", 2, caplog)
