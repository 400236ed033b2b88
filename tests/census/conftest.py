"""Fixtures of the census tests."""

from __future__ import annotations

import gc
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
