"""Fixtures of the interop tests: the trainers' real Hydra configs, composed once per module (each run of a
trainer with profile windows takes most of a minute on two shared cores)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

CONF = Path(__file__).resolve().parents[2] / "conf"


@pytest.fixture(scope="module")
def compose_once(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Any]:
    """compose_once(config_name, *overrides) -> DictConfig writing under a module's temporary folder."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    root = tmp_path_factory.mktemp("interop")

    def _compose(name: str, *overrides: str) -> Any:
        base = [f"runs_dir={root / 'runs'}", f"data.cache_dir={root / 'cache'}",
                "data.progress=false", "trainer_params.progress=false"]
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            return hydra_compose(config_name=name, overrides=base + list(overrides))

    return _compose
