"""Compose the real Hydra configs of conf/ with outputs redirected to tmp_path."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

CONF = Path(__file__).resolve().parents[2] / "conf"


@pytest.fixture
def compose(tmp_path: Path) -> Callable[..., Any]:
    """compose(config_name, *overrides) -> DictConfig writing under tmp_path, no progress bars."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    def _compose(name: str, *overrides: str) -> Any:
        base = [f"runs_dir={tmp_path / 'runs'}", f"data.cache_dir={tmp_path / 'cache'}",
                "data.progress=false", "trainer_params.progress=false"]
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            return hydra_compose(config_name=name, overrides=base + list(overrides))

    return _compose
