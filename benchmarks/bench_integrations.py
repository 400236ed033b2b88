"""Cost of the framework adapters (tbmem.integrations) at their defaults: a framework's step with the adapter
against the same step without it, in one process, interleaved, with an A/A control.

Variants per framework: ``off`` (no adapter), ``on`` (the adapter at tbmem's defaults: every=10,
census_every=500) and ``off_again`` (no adapter: the A/A control, whose distance from 1 is this run's noise).
Each round trains each variant afresh (a new model, a new Trainer) for ``--steps`` optimizer steps, in an
order rotated every round, and times the steps after the first ``--warmup`` (the adapter's set-up at train
begin, opening its run, is left out, as is the framework's). A census at the defaults comes once per 500
steps, more than a round holds: its cost is measured apart (the adapter's own census of the first round,
``duration_ms`` in its census.jsonl, at ``census_every=1``) and reported amortised over 500 steps.

Ratios: ``on`` over ``off`` and ``off_again`` over ``off``, medians of the per-round step times.

    .venv/bin/python benchmarks/bench_integrations.py --rounds 5 --steps 60
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")

import torch

from benchmarks._common import result_line

VARIANTS = ("off", "on", "off_again")
CENSUS_EVERY = 500  # MemoryWriterConfig's default


def _hf(adapter: Any, steps: int, warmup: int, out: str) -> float:
    import transformers

    from tests.integrations.test_transformers import _model, _Tokens

    times: list[float] = []

    class Clock(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter())

    args = transformers.TrainingArguments(out, per_device_train_batch_size=4, max_steps=steps, logging_steps=10,
                                          report_to="tensorboard", use_cpu=True, save_strategy="no",
                                          disable_tqdm=True, optim="adamw_torch_fused")
    callbacks = [Clock()] + ([adapter] if adapter is not None else [])
    transformers.Trainer(model=_model(), args=args, train_dataset=_Tokens(4 * steps), callbacks=callbacks).train()
    return (times[-1] - times[warmup - 1]) / (len(times) - warmup)


def _lightning(adapter: Any, steps: int, warmup: int, out: str) -> float:
    import lightning.pytorch as pl

    from tests.integrations._lit import module_class

    times: list[float] = []

    class Clock(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            times.append(time.perf_counter())

    callbacks = [Clock()] + ([adapter] if adapter is not None else [])
    trainer = pl.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=pl.loggers.TensorBoardLogger(out),
                         callbacks=callbacks, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=out, log_every_n_steps=10)
    trainer.fit(module_class(pl)())
    return (times[-1] - times[warmup - 1]) / (len(times) - warmup)


def _accelerate(adapter: Any, steps: int, warmup: int, out: str) -> float:
    import accelerate

    accelerate.state.AcceleratorState._reset_state(reset_partial_state=True)
    acc = accelerate.Accelerator(log_with=[adapter] if adapter is not None else None, cpu=True)
    acc.init_trackers("bench")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    opt = torch.optim.AdamW(model.parameters())
    model, opt = acc.prepare(model, opt)
    x, y = torch.randn(64, 64), torch.randn(64, 1)
    times = []
    for step in range(steps):
        with acc.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(x), y)
            acc.backward(loss)
            opt.step()
            if adapter is not None:
                adapter.after_step(acc, step)
            opt.zero_grad()
        acc.log({"loss": loss.item()}, step=step)
        times.append(time.perf_counter())
    acc.end_training()
    return (times[-1] - times[warmup - 1]) / (len(times) - warmup)


def _adapter(framework: str, out: str, **options: Any) -> Any:
    if framework == "transformers":
        from tbmem.integrations.transformers import MemoryCallback

        return MemoryCallback(**options)
    if framework == "lightning":
        from tbmem.integrations.lightning import MemoryCallback as LitCallback

        return LitCallback(**options)
    from tbmem.integrations.accelerate import MemoryTracker

    return MemoryTracker(os.path.join(out, "tbmem"), **options)


RUNNERS: dict[str, Callable[..., float]] = {"transformers": _hf, "lightning": _lightning, "accelerate": _accelerate}


def _census_ms(framework: str, steps: int, warmup: int) -> float:
    """Median duration of the adapter's own censuses at census_every=1 (every step)."""
    out = tempfile.mkdtemp(prefix="bench-integ-census-")
    RUNNERS[framework](_adapter(framework, out, census_every=1), min(steps, 12), min(warmup, 4), out)
    lines = [json.loads(line) for p in Path(out).rglob("census.jsonl") for line in p.read_text().splitlines()]
    return statistics.median(d["duration_ms"] for d in lines[2:] or lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--frameworks", default="transformers,lightning,accelerate")
    args = parser.parse_args()
    print(f"{'framework':<13} {'off ms/step':>12} {'on ms/step':>11} {'on/off':>7} {'A/A':>7} "
          f"{'census ms':>10} {'on/off + census/500':>20}")
    for framework in args.frameworks.split(","):
        times: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for r in range(args.rounds):
            order = VARIANTS[r % 3:] + VARIANTS[:r % 3]
            for variant in order:
                out = tempfile.mkdtemp(prefix=f"bench-integ-{variant}-")
                adapter = _adapter(framework, out) if variant == "on" else None
                gc.collect()
                times[variant].append(RUNNERS[framework](adapter, args.steps, args.warmup, out))
        med = {v: statistics.median(t) for v, t in times.items()}
        census = _census_ms(framework, args.steps, args.warmup)
        ratio, control = med["on"] / med["off"], med["off_again"] / med["off"]
        amortised = (med["on"] + census / 1e3 / CENSUS_EVERY) / med["off"]
        print(f"{framework:<13} {med['off'] * 1e3:>12.2f} {med['on'] * 1e3:>11.2f} {ratio:>7.4f} {control:>7.4f} "
              f"{census:>10.1f} {amortised:>20.4f}", flush=True)
        print(result_line(f"integrations.{framework}.step", ratio, 1.01))
        print(result_line(f"integrations.{framework}.aa_control", control))
        print(result_line(f"integrations.{framework}.with_census", amortised))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
