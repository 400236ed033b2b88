"""Cost of the framework adapters (tbmem.integrations) at their defaults: a framework's step with the adapter
against the same step without it, in one process, interleaved, with an A/A control; and the time spent in
the adapter itself, which those ratios cannot resolve on a noisy machine.

Variants per framework: ``off`` (no adapter), ``on`` (the adapter at tbmem's defaults: every=10,
census_every=500) and ``off_again`` (no adapter: the A/A control, whose distance from 1 is this run's noise).
Every variant logs its loss to TensorBoard, as a user does with or without tbmem: Hugging Face's
``report_to="tensorboard"``, Lightning's ``TensorBoardLogger`` (kept beside the adapter), accelerate's
``log_with="tensorboard"`` (which tbmem's tracker replaces: ``on`` is ``log_with=[MemoryTracker(...)]``).
Each round trains each variant afresh (a new model, a new Trainer) for ``--steps`` optimizer steps, in an
order rotated every round, and times the steps after the first ``--warmup`` (the adapter's set-up at train
begin, opening its run, is left out, as is the framework's).

Two measures:

* ``on/off``: the median over rounds of each round's ratio of mean step times (a round's three runs are
  adjacent in time, so the machine's slower drift cancels). Its resolution is the A/A control: on 2 shared
  cores a fresh training of the same model varies by several percent, more than the 1% asked of the adapter.
* ``own``: the time inside the adapter's entry points (every callback method the framework calls, its
  forward hook, the tracker's ``log`` and ``after_step``, and the census's ``gc`` callback, which the writer
  keeps registered between censuses) per timed step of each ``on`` run (``inside us``),
  less what the ``off`` runs spent in the tracker the adapter replaces (``replaced us``: accelerate's
  TensorBoard tracker's ``log``, which flushes its file on every call; none for Hugging Face and Lightning,
  whose TensorBoard logging stays), over the step time: ``1 + own / step``. Every call is timed with
  ``perf_counter`` (about 0.1 us, counted against the adapter); what the adapter costs outside its calls
  (memory it holds, cache effects) is left out, and ``on/off`` bounds it.

A census at the defaults comes once per 500 steps, more than a round holds: its cost is measured apart (the
adapter's own census of a short run at ``census_every=1``, ``duration_ms`` in its census.jsonl) and
amortised over 500 steps (``own + census/500``), the number the limit (1.01) is checked on.

    .venv/bin/python benchmarks/bench_integrations.py --rounds 5 --steps 100 --warmup 10
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")

import torch

from benchmarks._common import result_line

VARIANTS = ("off", "on", "off_again")
#: ``small``: every framework trains a small GPT-2 (4 layers, width 128, batches of 8 sequences of 64 tokens,
#: AdamW): a step of about 50 ms here, where the limit is checked. ``tiny``: the tests' GPT-2 (2 layers, width 32,
#: batches of 4 sequences of 16 tokens): a step of about 4 ms. ``toy``: the tests' smallest models (Lightning's
#: Linear+BatchNorm, an MLP under accelerate; Hugging Face keeps the tiny GPT-2): a step of about 1 ms. The
#: adapter's cost is a constant per optimizer step: the smaller models show it as a larger fraction.
MODELS = ("small", "tiny", "toy")
GPT2_SIZES = {"small": {"n_layer": 4, "n_head": 4, "n_embd": 128, "n_positions": 64, "vocab_size": 1000},
              "tiny": {"n_layer": 2, "n_head": 2, "n_embd": 32, "n_positions": 16, "vocab_size": 100}}
BATCH = {"small": 8, "tiny": 4}
MODEL = "small"
CENSUS_EVERY = 500  # MemoryWriterConfig's default
LIMIT = 1.01
GC = "census gc callback"


def _size() -> str:
    return "small" if MODEL == "small" else "tiny"


def _gpt2() -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(**GPT2_SIZES[_size()], bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config)


class _Tokens(torch.utils.data.Dataset):
    """``n`` random sequences as long as the GPT-2's context, each its own labels."""

    def __init__(self, n: int) -> None:
        size = GPT2_SIZES[_size()]
        self.x = torch.randint(0, size["vocab_size"], (n, size["n_positions"]),
                               generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.x[i], "labels": self.x[i]}


class Stopwatch:
    """The calls into an object's entry points: (start, seconds, name) of each, timed around its bound methods."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, float, str]] = []

    def wrap(self, obj: Any, names: list[str]) -> Any:
        for name in names:
            setattr(obj, name, self._timed(getattr(obj, name), name))  # on the instance: callers getattr() it
        return obj

    def _timed(self, method: Callable[..., Any], name: str) -> Callable[..., Any]:
        calls, clock = self.calls, time.perf_counter

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return method(*args, **kwargs)
            finally:
                calls.append((start, clock() - start, name))
        return timed

    @contextlib.contextmanager
    def census_capture(self) -> Iterator[None]:
        """Time the census's gc callback too (``tbmem._internal.census.heap``): between censuses the writer
        keeps it in ``gc.callbacks``, called at every collection of the training's own objects."""
        from tbmem._internal.census import heap

        original = heap._on_collection
        heap._on_collection = self._timed(original, GC)  # what start_capture appends and stop_capture removes
        try:
            yield
        finally:
            heap._on_collection = original

    def between(self, first: float, last: float, only: str | None = None) -> float:
        """Seconds spent in calls (named ``only``) that began inside the timed steps."""
        return sum(seconds for start, seconds, name in self.calls
                   if first < start <= last and (only is None or name == only))


def _entry_points(obj: Any, *extra: str) -> list[str]:
    """The framework's hooks the adapter defines (``on_*``, ``setup``, ``teardown``) and ``extra``."""
    return sorted({n for n in dir(type(obj)) if n.startswith("on_") or n in ("setup", "teardown")} | set(extra))


Window = tuple[float, float, int]  # the timed steps: the clock when the first began, when the last ended, how many


def _window(times: list[float], warmup: int) -> Window:
    return times[warmup - 1], times[-1], len(times) - warmup


def _hf(adapter: Any, steps: int, warmup: int, out: str, watch: Stopwatch) -> Window:
    import transformers

    times: list[float] = []

    class Clock(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter())

    args = transformers.TrainingArguments(out, per_device_train_batch_size=BATCH[_size()], max_steps=steps,
                                          logging_steps=10, report_to="tensorboard", use_cpu=True,
                                          save_strategy="no", disable_tqdm=True, optim="adamw_torch_fused")
    if adapter is not None:
        watch.wrap(adapter, _entry_points(adapter, "_after_forward"))  # the forward hook binds it at train begin
    callbacks = [Clock()] + ([adapter] if adapter is not None else [])
    trainer = transformers.Trainer(model=_gpt2(), args=args, train_dataset=_Tokens(BATCH[_size()] * steps),
                                   callbacks=callbacks)
    trainer.remove_callback(transformers.trainer_callback.PrinterCallback)  # disable_tqdm's: prints every log
    trainer.train()
    return _window(times, warmup)


def _gpt2_module(pl: Any) -> Any:
    """The Hugging Face benchmark's GPT-2 as a LightningModule, AdamW, its batches."""

    class GPT2(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = _gpt2()

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            loss = self.model(**batch).loss
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters())

        def train_dataloader(self) -> torch.utils.data.DataLoader:
            batch = BATCH[_size()]
            return torch.utils.data.DataLoader(_Tokens(batch * self.trainer.max_steps), batch_size=batch)

    return GPT2()


def _lightning(adapter: Any, steps: int, warmup: int, out: str, watch: Stopwatch) -> Window:
    import lightning.pytorch as pl

    from tests.integrations._lit import module_class

    times: list[float] = []

    class Clock(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            times.append(time.perf_counter())

    if adapter is not None:
        watch.wrap(adapter, _entry_points(adapter))
    callbacks = [Clock()] + ([adapter] if adapter is not None else [])
    trainer = pl.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=pl.loggers.TensorBoardLogger(out),
                         callbacks=callbacks, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=out, log_every_n_steps=10)
    trainer.fit(module_class(pl)() if MODEL == "toy" else _gpt2_module(pl))
    return _window(times, warmup)


def _accelerate(adapter: Any, steps: int, warmup: int, out: str, watch: Stopwatch) -> Window:
    """Own time: the adapter's, or (``off``) what accelerate's TensorBoard tracker, which it replaces, spent."""
    import accelerate

    accelerate.state.AcceleratorState._reset_state(reset_partial_state=True)
    if adapter is not None:
        watch.wrap(adapter, ["log", "after_step", "store_init_configuration"])
    acc = accelerate.Accelerator(log_with=[adapter] if adapter is not None else "tensorboard", project_dir=out,
                                 cpu=True)
    acc.init_trackers("bench")
    if adapter is None:
        for tracker in acc.trackers:
            watch.wrap(tracker, ["log"])
    model, batch = _accelerate_model()
    opt = torch.optim.AdamW(model.parameters())
    model, opt = acc.prepare(model, opt)
    times = []
    for step in range(steps):
        with acc.accumulate(model):
            loss = (torch.nn.functional.mse_loss(model(batch["x"]), batch["y"]) if MODEL == "toy"
                    else model(**batch).loss)
            acc.backward(loss)
            opt.step()
            if adapter is not None:
                adapter.after_step(acc, step)
            opt.zero_grad()
        acc.log({"loss": loss.item()}, step=step)
        times.append(time.perf_counter())
    acc.end_training()
    return _window(times, warmup)


def _accelerate_model() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    if MODEL != "toy":
        tokens = _Tokens(BATCH[_size()])
        return _gpt2(), {"input_ids": tokens.x, "labels": tokens.x}
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    return model, {"x": torch.randn(64, 64), "y": torch.randn(64, 1)}


def _adapter(framework: str, out: str, **options: Any) -> Any:
    if framework == "transformers":
        from tbmem.integrations.transformers import MemoryCallback

        return MemoryCallback(**options)
    if framework == "lightning":
        from tbmem.integrations.lightning import MemoryCallback as LitCallback

        return LitCallback(**options)
    from tbmem.integrations.accelerate import MemoryTracker

    return MemoryTracker(os.path.join(out, "tbmem"), **options)


RUNNERS: dict[str, Callable[..., Window]] = {
    "transformers": _hf, "lightning": _lightning, "accelerate": _accelerate}


def _census_ms(framework: str, steps: int, warmup: int) -> float:
    """Median duration of the adapter's own censuses at census_every=1 (every step)."""
    out = tempfile.mkdtemp(prefix="bench-integ-census-")
    RUNNERS[framework](_adapter(framework, out, census_every=1), min(steps, 12), min(warmup, 4), out, Stopwatch())
    lines = [json.loads(line) for p in Path(out).rglob("census.jsonl") for line in p.read_text().splitlines()]
    return statistics.median(d["duration_ms"] for d in lines[2:] or lines)


def _run(framework: str, variant: str, steps: int, warmup: int) -> tuple[float, float, float]:
    """One fresh training: seconds per timed step, and per step inside the adapter and in its gc callback."""
    out = tempfile.mkdtemp(prefix=f"bench-integ-{variant}-")
    adapter = _adapter(framework, out) if variant == "on" else None
    gc.collect()
    watch = Stopwatch()
    with watch.census_capture():
        first, last, n = RUNNERS[framework](adapter, steps, warmup, out, watch)
    return (last - first) / n, watch.between(first, last) / n, watch.between(first, last, GC) / n


def _measure(framework: str, rounds: int, steps: int, warmup: int) -> dict[str, float]:
    """Ratios of each round's own runs (paired: the machine's drift between rounds cancels), medians over rounds."""
    runs: list[dict[str, tuple[float, float, float]]] = []
    for r in range(rounds):
        runs.append({v: _run(framework, v, steps, warmup) for v in VARIANTS[r % 3:] + VARIANTS[:r % 3]})
        print(f"  {framework} round {r + 1}/{rounds}: " + ", ".join(
            f"{v} {runs[-1][v][0] * 1e3:.3f} ms" for v in VARIANTS), file=sys.stderr, flush=True)

    def median(variant: str, i: int) -> float:
        return statistics.median(run[variant][i] for run in runs)

    # what the off-runs spent in the tracker the adapter replaces (accelerate's TensorBoard tracker)
    replaced = statistics.median([run[v][1] for run in runs for v in ("off", "off_again")])
    extra = median("on", 1) - replaced
    return {"off": median("off", 0), "on": median("on", 0),
            "ratio": statistics.median(run["on"][0] / run["off"][0] for run in runs),
            "control": statistics.median(run["off_again"][0] / run["off"][0] for run in runs),
            "inside_us": median("on", 1) * 1e6, "gc_us": median("on", 2) * 1e6, "replaced_us": replaced * 1e6,
            "own": 1 + extra / (median("on", 0) - extra)}


COLUMNS = (("framework", 13, "{:<13}"), ("off ms/step", 12, "{:>12.3f}"), ("on ms/step", 11, "{:>11.3f}"),
           ("on/off", 7, "{:>7.4f}"), ("A/A", 7, "{:>7.4f}"), ("inside us", 10, "{:>10.1f}"),
           ("of it gc us", 12, "{:>12.1f}"), ("replaced us", 12, "{:>12.1f}"), ("own", 7, "{:>7.4f}"),
           ("census ms", 10, "{:>10.1f}"), ("own + census/500", 17, "{:>17.4f}"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--frameworks", default="transformers,lightning,accelerate")
    parser.add_argument("--model", choices=MODELS, default="small")
    args = parser.parse_args()
    global MODEL
    MODEL = args.model
    if args.warmup < 1 or args.steps <= args.warmup or args.rounds < 1:
        parser.error("need --rounds >= 1 and --steps > --warmup >= 1")
    print(" ".join(f"{title:>{width}}" if i else f"{title:<{width}}" for i, (title, width, _) in enumerate(COLUMNS)))
    for framework in args.frameworks.split(","):
        m = _measure(framework, args.rounds, args.steps, args.warmup)
        census = _census_ms(framework, args.steps, args.warmup)
        with_census = m["own"] + census / 1e3 / CENSUS_EVERY / m["off"]
        values = (framework, m["off"] * 1e3, m["on"] * 1e3, m["ratio"], m["control"], m["inside_us"], m["gc_us"],
                  m["replaced_us"], m["own"], census, with_census)
        print(" ".join(fmt.format(v) for (_, _, fmt), v in zip(COLUMNS, values)), flush=True)
        name = f"integrations.{framework}" + ("" if MODEL == "small" else f".{MODEL}")
        print(result_line(f"{name}.step", m["ratio"]))
        print(result_line(f"{name}.aa_control", m["control"]))
        print(result_line(f"{name}.own", m["own"]))
        print(result_line(f"{name}.own_with_census", with_census, LIMIT if MODEL == "small" else None))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
