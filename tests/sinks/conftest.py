"""Offline trackers for the sink tests: W&B in offline mode and an MLflow SQLite store, both under tmp_path."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """Environment for both trackers, offline and inside ``tmp_path``; yields the places."""
    wandb_dir = tmp_path / "wandb-home"
    wandb_dir.mkdir()
    places = {"wandb_dir": str(wandb_dir), "mlflow_db": str(tmp_path / "mlflow.db"),
              "mlflow_artifacts": str(tmp_path / "mlflow-artifacts")}
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(wandb_dir))
    for var, sub in (("WANDB_DATA_DIR", "data"), ("WANDB_CACHE_DIR", "cache"), ("WANDB_CONFIG_DIR", "config"),
                     ("WANDB_ARTIFACT_DIR", "artifacts")):
        monkeypatch.setenv(var, str(wandb_dir / sub))
    monkeypatch.setenv("WANDB_PROJECT", "tbmem-test")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{places['mlflow_db']}")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "tbmem-test")
    monkeypatch.chdir(tmp_path)  # anything a tracker writes relative to the working directory stays here
    _wandb_teardown()  # W&B reads its environment once per process (wandb.setup): read this test's
    yield places
    _wandb_teardown()


def _wandb_teardown() -> None:
    wandb = sys.modules.get("wandb")
    if wandb is not None:
        wandb.teardown()


@pytest.fixture
def mlflow_client(offline: dict[str, str]) -> object:
    """A client of the SQLite store, with the experiment's artifacts under tmp_path."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    client.create_experiment("tbmem-test", artifact_location=Path(offline["mlflow_artifacts"]).as_uri())
    return client
