"""The test model with known sizes: tied embedding/output weight and a BatchNorm."""

from __future__ import annotations

from typing import Any, Iterator

import torch
from torch import nn

__all__ = ["TiedNet", "VOCAB", "DIM", "HIDDEN", "storage_bytes", "storage_ptrs", "tensors_in"]

VOCAB, DIM, HIDDEN = 50, 16, 32


class TiedNet(nn.Module):
    """Embedding -> Linear -> BatchNorm -> ReLU -> Linear -> output tied to the embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.body = nn.Sequential(nn.Linear(DIM, HIDDEN), nn.BatchNorm1d(HIDDEN), nn.ReLU())
        self.head = nn.Linear(HIDDEN, DIM)
        self.out = nn.Linear(DIM, VOCAB, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.out(self.head(self.body(self.emb(idx))))


def storage_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes of the distinct storages of ``tensors``, from data_ptr and nbytes."""
    seen: dict[int, int] = {}
    for t in tensors:
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def storage_ptrs(tensors: list[torch.Tensor]) -> set[int]:
    """Data pointers of the storages of ``tensors``."""
    return {t.untyped_storage().data_ptr() for t in tensors}


def tensors_in(value: Any) -> Iterator[torch.Tensor]:
    """Every tensor in ``value``, through lists, tuples and dicts (an optimizer's state, say)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from tensors_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from tensors_in(item)
