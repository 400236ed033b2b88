"""The trainers' real Hydra configs (conf/), composed with every output under a test's folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

__all__ = ["CONF", "composer"]

CONF = Path(__file__).resolve().parents[1] / "conf"


def composer(root: Path) -> Callable[..., Any]:
    """``compose(config_name, *overrides) -> DictConfig``: runs under ``root/runs``, data cached in
    ``root/cache``, no progress bars."""
    def compose(name: str, *overrides: str) -> Any:
        from hydra import compose as hydra_compose
        from hydra import initialize_config_dir

        base = [f"runs_dir={root / 'runs'}", f"data.cache_dir={root / 'cache'}",
                "data.progress=false", "trainer_params.progress=false"]
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            return hydra_compose(config_name=name, overrides=base + list(overrides))

    return compose
