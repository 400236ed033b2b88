"""``trainer_params.batch_size: auto``: the SyntheticTrainer picks its batch size from a memory forecast.

:func:`forecast_trainer` runs the trainer's own training step (the rollout loss,
backward, optimizer step) at the probe sizes ``auto_batch_sizes`` with
:func:`tbmem.forecast.fit`, then puts the model, optimizer, gradient scaler and
random generators back as they were: the training that follows is the one a fixed
batch size would give. :func:`choose_batch_size` takes the largest batch that fits
the budget (``auto_batch_budget_gb``, else free device memory or available RAM minus
tbmem's margins), at most ``auto_batch_max`` and the training set's length, and
says which of these limits decided.

Example:
    >>> import tempfile
    >>> from trainers.config import validate
    >>> from trainers.monitoring import TrainerMonitoring
    >>> from trainers.synthetic import SyntheticTrainer
    >>> from trainers.autobatch import choose_batch_size
    >>> cfg = validate({"experiment": "doc", "data": {"resolution": 16, "num_frames": 8, "num_sims": 2,
    ...     "cache_dir": tempfile.mkdtemp(), "progress": False}, "model": {"levels": 2, "filters": 4},
    ...     "trainer_params": {"train_sim": [0], "val_sim": [1], "progress": False}})
    >>> mon = TrainerMonitoring.create(tempfile.mkdtemp(), enabled=False, verbose_batches=0, tbmem_config=cfg.tbmem)
    >>> choice = choose_batch_size(SyntheticTrainer(cfg, monitoring=mon), budget_bytes=2**40, quiet=True)
    >>> choice.batch_size, choice.limited_by  # a 2**40-byte budget: the 4 training samples decide
    (4, 'training set')
    >>> mon.close()
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch
from torch.utils.data import default_collate

from trainers.config import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from tbmem.forecast import Forecast
    from trainers.synthetic import SyntheticTrainer

__all__ = ["AutoBatch", "forecast_trainer", "choose_batch_size", "training_step", "batch_maker"]


@dataclass(frozen=True)
class AutoBatch:
    """The batch size ``auto`` chose, and why.

    Attributes:
        batch_size: The chosen size.
        limited_by: ``"memory"``, ``"auto_batch_max"`` or ``"training set"``.
        memory_limit: The largest size that fits the budget (None: any size fits).
        budget_bytes: The budget.
        budget_explanation: How the budget was computed.
        forecast: The :class:`tbmem.forecast.Forecast`.
    """

    batch_size: int
    limited_by: str
    memory_limit: int | None
    budget_bytes: int
    budget_explanation: str
    forecast: "Forecast"

    def describe(self) -> str:
        """One line: what was chosen and why."""
        from tbmem.forecast import format_bytes

        f, n = self.forecast, self.batch_size
        q = f.quality
        fits = "any size" if self.memory_limit is None else f"up to {self.memory_limit}"
        why = {"memory": "the largest that fits", "auto_batch_max": "capped by trainer_params.auto_batch_max",
               "training set": "capped by the number of training samples"}[self.limited_by]
        holdout = "n/a" if q.holdout_error is None else f"{q.holdout_error:+.2%}"
        return (f"batch_size=auto: {n} ({why}; memory allows {fits}): forecast peak {format_bytes(f.peak_bytes(n))} "
                f"on {f.device} of a {format_bytes(self.budget_bytes)} budget ({self.budget_explanation}); fitted on "
                f"{'/'.join(map(str, f.batch_sizes))} in {f.fit_seconds:.1f} s: {format_bytes(f.fixed_bytes)} + "
                f"{format_bytes(f.bytes_per_sample)} per sample, held-out error {holdout}"
                + ("" if q.good else " (POOR fit: see the forecast's notes)"))


def training_step(trainer: "SyntheticTrainer") -> Callable[[Any], None]:
    """One training step of ``trainer`` on a ``(x0, targets)`` batch, as its epoch loop runs it
    (:meth:`trainers.synthetic.SyntheticTrainer.probe_step`)."""
    return trainer.probe_step()


def batch_maker(trainer: "SyntheticTrainer") -> Callable[[int], Any]:
    """``n -> batch``: ``n`` training samples (repeated when the set is smaller), collated on the CPU
    as the trainer's DataLoader does."""
    data = trainer.train_set

    def make(n: int) -> Any:
        return default_collate([data[i % len(data)] for i in range(n)])

    return make


def forecast_trainer(trainer: "SyntheticTrainer", sizes: Sequence[int] | None = None, *,
                     progress: bool = False) -> "Forecast":
    """Fit the memory forecast of ``trainer``'s training step; its state is restored afterwards.

    Args:
        trainer: A built SyntheticTrainer.
        sizes: Probe batch sizes (default ``trainer_params.auto_batch_sizes``).
        progress: Show a progress bar over the probes.
    """
    from tbmem.forecast import fit

    saved = io.BytesIO()
    torch.save({"model": trainer.net.state_dict(), "optimizer": trainer.optimizer.state_dict(),
                "scaler": trainer.scaler.state_dict()}, saved)
    rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state(trainer.device) if trainer.device.type == "cuda" else None
    was_training = trainer.net.training
    trainer.net.train()
    try:
        return fit(training_step(trainer), batch_maker(trainer),
                   batch_sizes=tuple(sizes or trainer.params.auto_batch_sizes), device=trainer.device,
                   model=trainer.net, optimizer=trainer.optimizer, progress=progress)
    finally:
        saved.seek(0)
        # tensors back where they were: on the model's and optimizer's device
        state = torch.load(saved, map_location=trainer.device, weights_only=True)
        trainer.net.load_state_dict(state["model"])
        trainer.optimizer.load_state_dict(state["optimizer"])
        trainer.scaler.load_state_dict(state["scaler"])
        trainer.optimizer.zero_grad(set_to_none=True)
        torch.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state(cuda_rng, trainer.device)
        trainer.net.train(was_training)


def choose_batch_size(trainer: "SyntheticTrainer", *, budget_bytes: int | None = None,
                      quiet: bool = False) -> AutoBatch:
    """The batch size ``auto`` resolves to, printed (unless ``quiet``) and written to TensorBoard.

    Args:
        trainer: A built SyntheticTrainer.
        budget_bytes: The budget; None: ``auto_batch_budget_gb`` or the device's default budget.
        quiet: Do not print.

    Raises:
        ConfigError: not even one sample fits the budget.
    """
    p = trainer.params
    forecast = forecast_trainer(trainer, progress=p.progress and not quiet)
    if budget_bytes is None and p.auto_batch_budget_gb is not None:
        budget_bytes = int(p.auto_batch_budget_gb * 2**30)
    if budget_bytes is None:
        budget = forecast.budget()
        budget_bytes, explanation = budget.bytes, budget.explanation
    else:
        explanation = "auto_batch_budget_gb" if p.auto_batch_budget_gb is not None else "given"
    fits = forecast.max_batch_size(budget_bytes)
    if fits == 0:
        from tbmem.forecast import format_bytes

        raise ConfigError(f"config key 'trainer_params.batch_size' is auto but not even one sample fits: the "
                          f"forecast peak at batch size 1 is {format_bytes(forecast.peak_bytes(1))}, the budget "
                          f"{format_bytes(budget_bytes)} ({explanation})")
    limits = [("auto_batch_max", p.auto_batch_max), ("training set", len(trainer.train_set))]
    if fits is not None:
        limits.insert(0, ("memory", fits))
    limited_by, size = min(limits, key=lambda kv: kv[1])
    choice = AutoBatch(batch_size=size, limited_by=limited_by, memory_limit=fits, budget_bytes=budget_bytes,
                       budget_explanation=explanation, forecast=forecast)
    if not quiet:
        print(choice.describe(), flush=True)
    from tbmem.forecast import FORECAST_TEXT_TAG

    trainer.mon.writer.add_text(FORECAST_TEXT_TAG, choice.describe() + "\n\n" + forecast.to_markdown(
        at=[size], budget_bytes=budget_bytes, budget_explanation=explanation, in_use=size), 0)
    return choice
