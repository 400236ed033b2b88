"""The compiled parts of tbmem (the census's C heap pass, the CPU allocation recorder) in tests."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

__all__ = ["not_built"]


def not_built(message: str) -> NoReturn:
    """Skip the test: a compiled part could not be built here. Under ``TBMEM_REQUIRE_C_EXTENSION=1``
    (set by .ci/run, which installs the compilers) that is a failure instead."""
    if os.environ.get("TBMEM_REQUIRE_C_EXTENSION") == "1":
        pytest.fail(message + " (TBMEM_REQUIRE_C_EXTENSION=1)")
    pytest.skip(message)
