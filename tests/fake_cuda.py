"""A fake CUDA device for tests: patches torch.cuda so tbmem's real code paths run on a CPU machine.

Only the functions tbmem calls are faked; the values are the allocator statistics a real
device would report, set by the test.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

__all__ = ["FakeCuda", "install_fake_cuda"]


@dataclass
class FakeCuda:
    """Allocator state the fake device reports."""

    allocated: int = 3 * 2**30
    reserved: int = 4 * 2**30
    peak_allocated: int = 3 * 2**30 + 2**29
    peak_reserved: int = 4 * 2**30
    active: int = 3 * 2**30
    inactive_split: int = 2**28
    total: int = 80 * 2**30
    free: int = 70 * 2**30
    retries: int = 2
    ooms: int = 1
    peak_resets: int = 0
    synchronized: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def memory_stats(self, device: int | None = None) -> dict[str, Any]:
        return {
            "allocated_bytes.all.current": self.allocated,
            "allocated_bytes.all.peak": self.peak_allocated,
            "reserved_bytes.all.current": self.reserved,
            "reserved_bytes.all.peak": self.peak_reserved,
            "active_bytes.all.current": self.active,
            "inactive_split_bytes.all.current": self.inactive_split,
            "num_alloc_retries": self.retries,
            "num_ooms": self.ooms,
            **self.extra,
        }

    def memory_stats_as_nested_dict(self, device: int | None = None) -> dict[str, Any]:
        """What torch builds in C++ and ``memory_stats`` flattens: the same values, nested by key part."""
        nested: dict[str, Any] = {}
        for key, value in torch.cuda.memory_stats(device).items():  # a test may have replaced memory_stats
            *parents, leaf = key.split(".")
            node = nested
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        return nested

    def reset_peak_memory_stats(self, device: int | None = None) -> None:
        self.peak_resets += 1
        self.peak_allocated = self.allocated
        self.peak_reserved = self.reserved


def install_fake_cuda(monkeypatch: pytest.MonkeyPatch, fake: FakeCuda | None = None) -> FakeCuda:
    """Make torch.cuda look available and initialised, backed by ``fake``."""
    fake = fake or FakeCuda()

    def synchronize(device: int | None = None) -> None:
        fake.synchronized += 1

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "memory_stats", fake.memory_stats)
    monkeypatch.setattr(torch.cuda, "memory_stats_as_nested_dict", fake.memory_stats_as_nested_dict)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: fake.allocated)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: fake.reserved)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: fake.peak_allocated)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (fake.free, fake.total))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", fake.reset_peak_memory_stats)
    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
    return fake
