"""Fixtures of the interop tests: the trainers' real Hydra configs, composed once per module (each run of a
trainer with profile windows takes most of a minute on two shared cores)."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from tests._hydra import composer


@pytest.fixture(scope="module")
def compose_once(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Any]:
    """compose_once(config_name, *overrides) -> DictConfig writing under a module's temporary folder."""
    return composer(tmp_path_factory.mktemp("interop"))
