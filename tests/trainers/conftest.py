"""Compose the real Hydra configs of conf/ with outputs redirected to tmp_path."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

from tests._hydra import composer


@pytest.fixture
def compose(tmp_path: Path) -> Callable[..., Any]:
    """compose(config_name, *overrides) -> DictConfig writing under tmp_path, no progress bars."""
    return composer(tmp_path)
