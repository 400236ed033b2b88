"""Fixtures of the census tests."""

from __future__ import annotations

import gc
import sys
from typing import Iterator

import pytest


@pytest.fixture
def no_automatic_gc() -> Iterator[None]:
    """Collections only where a test asks for one, so the scan method is deterministic."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.fixture
def gloo_world_of_one() -> Iterator[None]:
    """A gloo process group of one rank in this process (DDP, ZeRO and FSDP2 need one)."""
    import torch.distributed as dist

    if not dist.is_available() or sys.platform == "win32":
        pytest.skip("needs torch.distributed with gloo")
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
