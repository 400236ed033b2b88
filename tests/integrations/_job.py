"""One rank of a 2-rank torchrun job (gloo, CPU) training a tiny model through one framework's adapter.

``python -m torch.distributed.run --standalone --nproc_per_node=2 _job.py FRAMEWORK OUT``
"""

from __future__ import annotations

import os
import sys

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def hf(out: str) -> None:
    import transformers

    from tbmem.integrations.transformers import MemoryCallback
    from tests.integrations.test_transformers import _model, _Tokens

    args = transformers.TrainingArguments(out, per_device_train_batch_size=4, gradient_accumulation_steps=2,
                                          max_steps=4, logging_steps=1, report_to="tensorboard", use_cpu=True,
                                          save_strategy="no", disable_tqdm=True, ddp_backend="gloo")
    transformers.Trainer(model=_model(), args=args, train_dataset=_Tokens(),
                         callbacks=[MemoryCallback(census_every=2, every=1)]).train()


def lightning(out: str) -> None:
    import lightning.pytorch as pl

    from tbmem.integrations.lightning import MemoryCallback
    from tests.integrations._lit import module_class

    trainer = pl.Trainer(max_steps=4, accumulate_grad_batches=2, log_every_n_steps=1, accelerator="cpu", devices=2,
                         strategy="ddp", callbacks=[MemoryCallback(census_every=2, every=1)], default_root_dir=out,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module_class(pl)())


def accelerate(out: str) -> None:
    import accelerate as acc

    from tbmem.integrations.accelerate import MemoryTracker

    tracker = MemoryTracker(os.path.join(out, "tbmem"), census_every=2, every=1)
    accelerator = acc.Accelerator(log_with=[tracker], gradient_accumulation_steps=2, cpu=True)
    accelerator.init_trackers("job")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters())
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    model, optimizer, loader = accelerator.prepare(model, optimizer, torch.utils.data.DataLoader(data, batch_size=4))
    step = 0
    for x, y in loader:
        with accelerator.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            tracker.after_step(accelerator, step)
            optimizer.zero_grad()
        if accelerator.sync_gradients:
            accelerator.log({"loss": loss.item()}, step=step)
            step += 1
        if step == 4:
            break
    accelerator.end_training()


if __name__ == "__main__":
    {"hf": hf, "lightning": lightning, "accelerate": accelerate}[sys.argv[1]](sys.argv[2])
