"""Logdirs with known values, written through tbmem.MemoryWriter (real event files)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Mapping

from tbmem import MemoryWriter

__all__ = ["write_run", "CATEGORY"]

CATEGORY = "Memory/Tensor_Category/{}_MB"


def write_run(run_dir: str | Path, steps: range | list[int],
              values: Callable[[int], Mapping[str, float]]) -> Path:
    """One run: at each step, one event with ``values(step)`` (float32-exact values keep asserts exact)."""
    with MemoryWriter(str(run_dir), custom_layout=False) as writer:
        for step in steps:
            writer.write_scalars(values(step), step)
    return Path(run_dir)
