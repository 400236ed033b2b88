"""SyntheticTrainer: a UNet trained autoregressively on simulated trajectories (PyTorch).

Each batch rolls the network ``num_predict_steps`` times, feeding predictions
back, averages the per-step MSE and calls backward once. Memory monitoring is
a handful of hook calls on :class:`trainers.monitoring.TrainerMonitoring`,
switched on and off by the config alone.

Under torchrun (``distributed`` with more than one rank) the model is wrapped in
DistributedDataParallel, each rank trains on its share of the batches (a
DistributedSampler, reshuffled every epoch), validation is split across the ranks and
summed, and rank 0 alone saves checkpoints.

Example:
    >>> import tempfile
    >>> from trainers.config import validate
    >>> from trainers.monitoring import TrainerMonitoring, console_above_progress_bar
    >>> from trainers.synthetic import SyntheticTrainer
    >>> cfg = validate({"experiment": "doc", "data": {"resolution": 16, "num_frames": 8, "num_sims": 2,
    ...     "cache_dir": tempfile.mkdtemp(), "progress": False}, "model": {"levels": 2, "filters": 4},
    ...     "trainer_params": {"epochs": 1, "train_sim": [0], "val_sim": [1], "progress": False}})
    >>> mon = TrainerMonitoring.create(tempfile.mkdtemp(), enabled=False, verbose_batches=0,
    ...                                tbmem_config=cfg.tbmem)
    >>> result = SyntheticTrainer(cfg, monitoring=mon).train(); mon.close()
    >>> len(result.val_losses)
    1
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils.data import DataLoader, Subset

from tbmem import TAGS

from trainers.config import ConfigError, RunConfig
from trainers.data import channels, ensure_simulations
from trainers.dataset import HybridDataset
from trainers.distributed import Distributed
from trainers.models import build_model
from trainers.monitoring import TrainerMonitoring, console_above_progress_bar

__all__ = ["SyntheticTrainer", "SyntheticResult", "rollout_loss"]


@dataclass
class SyntheticResult:
    """Per-epoch losses and the checkpoints written."""

    train_losses: list[float] = field(default_factory=list)
    val_losses: list[float] = field(default_factory=list)
    checkpoints: list[Path] = field(default_factory=list)
    steps: int = 0


def rollout_loss(model: torch.nn.Module, x0: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean over the ``T`` steps of the MSE of the autoregressive rollout from ``x0``."""
    state, total = x0, x0.new_zeros(())
    steps = targets.shape[1]
    for t in range(steps):
        state = model(state)
        total = total + torch.nn.functional.mse_loss(state.float(), targets[:, t].float())
    return total / steps


class SyntheticTrainer:
    """Trains the configured network on ``trainer_params.train_sim``, validating on ``val_sim``.

    Args:
        cfg: The validated run config.
        monitoring: The run's writer and monitors.
        device: Where the model and batches live (default CPU).
        checkpoint_dir: Where checkpoints go (default ``<log_dir>/checkpoints``).
        distributed: The job (:func:`trainers.distributed.setup`); default a single process.
    """

    def __init__(self, cfg: RunConfig, *, monitoring: TrainerMonitoring, device: torch.device | None = None,
                 checkpoint_dir: Path | None = None, distributed: Distributed | None = None) -> None:
        self.cfg, self.params, self.mon = cfg, cfg.trainer_params, monitoring
        self.device = device or torch.device("cpu")
        self.dist = distributed or Distributed()
        self.checkpoint_dir = checkpoint_dir or Path(monitoring.writer.log_dir) / "checkpoints"
        data = cfg.data
        for key in ("train_sim", "val_sim"):
            bad = [i for i in getattr(self.params, key) if i >= data.num_sims]
            if bad:
                raise ConfigError(f"config key 'trainer_params.{key}' names simulations {bad} but "
                                  f"data.num_sims is {data.num_sims}")
        folder = ensure_simulations(data)
        kwargs = dict(num_predict_steps=self.params.num_predict_steps, max_cached_sims=data.max_cached_sims)
        self.train_set = HybridDataset(folder, self.params.train_sim,
                                       use_sliding_window=self.params.use_sliding_window, **kwargs)
        self.val_set = (HybridDataset(folder, self.params.val_sim, use_sliding_window=False, **kwargs)
                        if self.params.val_sim else None)
        # Seeded here, after the data: generating the cache reseeds torch, reusing it does not.
        torch.manual_seed(cfg.seed)
        self.net = build_model(cfg.model, dim=data.dim, channels=channels(data),
                               resolution=data.resolution).to(self.device)
        self.model: torch.nn.Module = self.net
        # DDP's context that skips the gradient all-reduce of a micro-batch that does not step
        self._no_sync: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext
        if self.dist.active:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            ddp = DistributedDataParallel(self.net, device_ids=ids)
            self.model, self._no_sync = ddp, ddp.no_sync
        self.optimizer = self._optimizer()
        self.scheduler = self._scheduler()
        self.amp_dtype = (torch.float16 if self.device.type == "cuda" else torch.bfloat16) \
            if self.params.use_amp else None
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.amp_dtype == torch.float16)
        self.mon.writer.watch(self.net, self.optimizer)
        self.batch_size = self._batch_size()

    def _batch_size(self) -> int:
        if self.params.batch_size != "auto":
            return int(self.params.batch_size)
        from trainers.autobatch import choose_batch_size

        chosen = choose_batch_size(self).batch_size
        # every rank must step in lockstep with the same batch: the smallest choice fits them all
        return self.dist.all_reduce_min(chosen, device=self.device)

    def _optimizer(self) -> torch.optim.Optimizer:
        p = self.params
        if p.optimizer == "sgd":
            return torch.optim.SGD(self.net.parameters(), lr=p.learning_rate, momentum=0.9,
                                   weight_decay=p.weight_decay)
        cls = torch.optim.AdamW if p.optimizer == "adamw" else torch.optim.Adam
        return cls(self.net.parameters(), lr=p.learning_rate, weight_decay=p.weight_decay)

    def _scheduler(self) -> Any:
        p = self.params
        if p.scheduler == "cosine":
            return torch.optim.lr_scheduler.CosineAnnealingLR(self.optimizer, T_max=p.epochs)
        if p.scheduler == "step":
            return torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=max(1, p.epochs // 3), gamma=0.5)
        return None

    def _loader(self, dataset: Any, shuffle: bool) -> DataLoader:
        generator = torch.Generator().manual_seed(self.cfg.seed)
        sampler: torch.utils.data.Sampler[int] | None = None
        if shuffle and self.dist.active:
            from torch.utils.data.distributed import DistributedSampler

            # every rank gets as many batches (padded by repetition): the steps stay in lockstep
            sampler = DistributedSampler(dataset, num_replicas=self.dist.world_size, rank=self.dist.rank,
                                         shuffle=True, seed=self.cfg.seed)
        return DataLoader(dataset, batch_size=self.batch_size, shuffle=shuffle and sampler is None,
                          sampler=sampler, generator=generator, num_workers=self.params.num_workers,
                          pin_memory=self.cfg.data.pin_memory and self.device.type == "cuda")

    def _autocast(self) -> Any:
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.amp_dtype)

    def probe_step(self) -> Callable[[Any], None]:
        """One training step on a ``(x0, targets)`` batch, as the epoch loop runs it: what a memory
        forecast measures (:func:`trainers.autobatch.forecast_trainer`)."""
        accum = self.params.gradient_accumulation_steps

        def step(batch: Any) -> None:
            x0, targets = batch
            x0 = x0.to(self.device, non_blocking=True)
            targets = targets.to(self.device, non_blocking=True)
            with self._autocast():
                # the unwrapped module: under DDP a probe must not start gradient all-reduces
                loss = rollout_loss(self.net, x0, targets)
            self.scaler.scale(loss / accum).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.optimizer.zero_grad(set_to_none=True)

        return step

    def train(self) -> SyntheticResult:
        """Run all epochs; return the losses.

        With ``trainer_params.progress`` the bar counts batches over the whole run (an epoch of
        the full experiment takes minutes): ``epoch 3/20``, batches done, time left, the latest
        batch's loss and the last epoch's train and validation losses. Shown on rank 0 only.
        """
        from tqdm import tqdm

        p = self.params
        result = SyntheticResult()
        loader = self._loader(self.train_set, shuffle=True)
        shown = p.progress and self.dist.is_root
        bar = tqdm(total=p.epochs * len(loader), desc=f"epoch 1/{p.epochs}", unit="batch", disable=not shown,
                   dynamic_ncols=True)
        try:
            with console_above_progress_bar(shown):
                return self._train_epochs(bar, loader, result)
        finally:
            bar.close()  # on Ctrl-C too: the bar's last line before run.py's line saying where the run stopped

    def _train_epochs(self, bar: Any, loader: Any, result: SyntheticResult) -> SyntheticResult:
        p, mon, writer = self.params, self.mon, self.mon.writer
        accum = p.gradient_accumulation_steps
        best = math.inf
        step = 0
        last_epoch = ""
        for epoch in range(p.epochs):
            bar.set_description(f"epoch {epoch + 1}/{p.epochs}", refresh=False)
            if isinstance(getattr(loader, "sampler", None), _distributed_sampler()):
                loader.sampler.set_epoch(epoch)
            self.model.train()
            mon.on_epoch_start()
            total, batches = 0.0, len(loader)
            self.optimizer.zero_grad(set_to_none=True)
            for batch_idx, (x0, targets) in enumerate(loader):
                mon.on_batch_start(batch_idx, step)
                try:
                    x0 = x0.to(self.device, non_blocking=True)
                    targets = targets.to(self.device, non_blocking=True)
                    with self._autocast():
                        loss = rollout_loss(self.model, x0, targets)
                    if mon.mid_step_hooks:  # a record before backward, or snapshot markers
                        mon.before_backward(step, loss)
                    last_micro = (batch_idx + 1) % accum == 0 or batch_idx + 1 == batches
                    # DDP: gradients are averaged across ranks on the micro-batch that steps only
                    sync = self._no_sync() if not last_micro else contextlib.nullcontext()
                    with sync:
                        self.scaler.scale(loss / accum).backward()
                    if last_micro:
                        if mon.mid_step_hooks:
                            mon.before_optimizer(step)
                        self.scaler.step(self.optimizer)
                        self.scaler.update()
                        if step >= mon.grad_norm_next:  # Train/grad_norm, every tbmem.every steps
                            mon.log_grad_norm(step, self.net, amp_scaled=self.scaler.is_enabled())
                    mon.before_zero_grad(step, loss)  # the record: gradients and optimizer state alive
                    if last_micro:
                        self.optimizer.zero_grad(set_to_none=True)
                except BaseException as exc:  # out of memory: snapshot and record saved, then raised on
                    mon.on_step_error(step, exc)
                    raise
                value = loss.item()
                mon.on_batch_end(batch_idx, value)
                bar.set_postfix_str(f"loss={value:.4g}{last_epoch}", refresh=False)
                bar.update(1)
                total += value
                step += 1
            mon.on_epoch_end()
            lr = self.optimizer.param_groups[0]["lr"]
            if self.scheduler is not None:
                self.scheduler.step()
            train_loss = total / max(batches, 1)
            result.train_losses.append(train_loss)
            readings = {"train_loss": train_loss, "learning_rate": lr}
            val_loss = self.validate() if self.val_set is not None else None
            if val_loss is not None:
                result.val_losses.append(val_loss)
                readings["val_loss"] = val_loss
            writer.write_scalars({TAGS[key].tag: value / TAGS[key].scale for key, value in readings.items()}, epoch)
            last_epoch = f", epoch train={train_loss:.4g}" + ("" if val_loss is None else f" val={val_loss:.4g}")
            score = val_loss if val_loss is not None else train_loss
            if score < best:
                best = score
                if self.dist.is_root:
                    path = self._save("best.pt", epoch, score)
                    if path not in result.checkpoints:
                        result.checkpoints.append(path)
            if self.dist.is_root and not p.save_best_only and p.save_interval and (epoch + 1) % p.save_interval == 0:
                result.checkpoints.append(self._save(f"epoch_{epoch + 1:04d}.pt", epoch, score))
        bar.close()
        result.steps = step
        writer.flush()
        return result

    @torch.no_grad()
    def validate(self) -> float:
        """Mean rollout loss over the validation simulations (split across ranks, then summed)."""
        assert self.val_set is not None
        self.net.eval()
        dataset: Any = self.val_set
        if self.dist.active:  # rank r takes windows r, r + W, ...: each window exactly once
            dataset = Subset(self.val_set, range(self.dist.rank, len(self.val_set), self.dist.world_size))
        total, count = 0.0, 0.0
        for x0, targets in self._loader(dataset, shuffle=False):
            with self._autocast():
                loss = rollout_loss(self.net, x0.to(self.device), targets.to(self.device))
            total += loss.item() * x0.shape[0]
            count += x0.shape[0]
        total, count = self.dist.all_reduce_sum([total, count], self.device)
        return total / max(count, 1)

    def _save(self, name: str, epoch: int, score: float) -> Path:
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        path = self.checkpoint_dir / name
        torch.save({"model": self.net.state_dict(), "optimizer": self.optimizer.state_dict(),
                    "epoch": epoch, "score": score}, path)
        return path


def _distributed_sampler() -> type:
    from torch.utils.data.distributed import DistributedSampler

    return DistributedSampler
