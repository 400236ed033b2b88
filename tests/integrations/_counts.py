"""The tests' own count of what a census must find, and the run's files read back."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from tbmem._internal.logdir.census_log import CensusLog, census_log_path
from tests._events import read_events

__all__ = ["CATEGORIES", "censuses", "count", "run_dirs", "scalar_steps", "storage_bytes"]

CATEGORIES = ("parameters", "gradients", "optimizer_state", "buffers")


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages under ``tensors`` (a tied weight, a view: counted once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def _state_tensors(optimizer: Any) -> list[torch.Tensor]:
    opt = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer
    return [v for state in opt.state.values() for v in state.values() if isinstance(v, torch.Tensor)]


def count(model: torch.nn.Module, optimizer: Any) -> dict[str, int]:
    """Parameters, gradients, optimizer state and buffers of ``model``/``optimizer`` right now."""
    params = list(model.parameters())
    return {"parameters": storage_bytes(params),
            "gradients": storage_bytes(p.grad for p in params if p.grad is not None),
            "optimizer_state": storage_bytes(_state_tensors(optimizer)),
            "buffers": storage_bytes(model.buffers())}


def censuses(run: str | Path) -> dict[int, dict[str, Any]]:
    """step -> the census line of ``run`` (its census.jsonl)."""
    return CensusLog().read(census_log_path(str(run)))


def scalar_steps(run: str | Path, tag: str) -> list[int]:
    """The steps of scalar ``tag`` in ``run`` (every event file of the folder)."""
    acc = read_events(run)
    return [e.step for e in acc.Scalars(tag)] if tag in acc.Tags()["scalars"] else []


def run_dirs(root: str | Path) -> list[Path]:
    """The folders under ``root`` holding event files."""
    return sorted({p.parent for p in Path(root).rglob("events.out.tfevents.*")})
