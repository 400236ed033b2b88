"""Tiny real training loops (CPU, a few seconds) that write tbmem logdirs, with and without leaks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tbmem import MemoryWriter

__all__ = ["train", "LEAKS"]

#: The leaks users actually write: a loss accumulated with its graph, activations kept across steps.
LEAKS = ("total_loss", "keep_activations")


def train(log_dir: str | Path, *, leak: str | None = None, seed: int = 0, steps: int = 200,
          every: int = 5, census_every: int = 20, hidden: int = 512, batch: int = 256,
          **writer_options: Any) -> Path:
    """Train a small MLP for ``steps`` steps with a MemoryWriter; optionally leak memory every step.

    ``keep_activations`` keeps one [batch, hidden] float32 activation (0.5 MB at the defaults) per step;
    ``total_loss`` does ``total_loss += loss`` without ``.item()`` on a loss whose graph no backward
    frees (a metric or eval pass without ``torch.no_grad``): every step's graph and its saved
    activations stay alive through ``total_loss``.
    ``writer_options`` go to MemoryWriter (``snapshot={...}``).
    """
    if leak not in (None, *LEAKS):
        raise ValueError(f"unknown leak {leak!r}")
    torch.manual_seed(seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: threads only add contention on a shared CI machine
    try:
        return _run(log_dir, leak, steps, hidden, batch,
                    dict(every=every, census_every=census_every, custom_layout=False, **writer_options))
    finally:
        torch.set_num_threads(threads)


def _run(log_dir: str | Path, leak: str | None, steps: int, hidden: int, batch: int,
         options: dict[str, Any]) -> Path:
    model = torch.nn.Sequential(torch.nn.Linear(32, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    kept: list[torch.Tensor] = []
    total_loss: torch.Tensor | float = 0.0
    with MemoryWriter(str(log_dir), **options) as writer:
        writer.watch(model, opt)
        for step in range(steps):
            x = torch.randn(batch, 32)
            y = x[:, :1] * 0.5
            h = model[1](model[0](x))
            loss = torch.nn.functional.mse_loss(model[2](h), y)
            if leak == "keep_activations":
                kept.append(h)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if leak == "total_loss":
                total_loss = total_loss + torch.nn.functional.mse_loss(model(x), y)
            else:
                total_loss += loss.item()
            writer.add_scalar("Loss/train", loss.item(), step)
            writer.log_memory(step)
    return Path(log_dir)
