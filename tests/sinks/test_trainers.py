"""Both trainers with ``tbmem.sinks: [wandb, mlflow]`` (offline): W&B's and MLflow's values and steps are
TensorBoard's, tags grouped, the snapshots present as artifacts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tbmem._internal.sinks.wandb_sink import metric_name
from tests.trainers.conftest import compose  # noqa: F401 - the fixture
from trainers.experiment import run_experiment

from ._readers import (mlflow_series, same_as_float32, tensorboard_series, wandb_artifacts, wandb_history,
                       wandb_records, wandb_run_files)


@pytest.mark.slow
@pytest.mark.parametrize("config,trainer", [("burgers_quick_test", "synthetic_with_memory"),
                                            ("burgers_physical_quick_test", "physical_with_memory")])
def test_trainer_sends_the_same_readings_to_wandb_and_mlflow(compose,  # noqa: F811
    tmp_path: Path, offline: dict,
                                                             mlflow_client, config: str, trainer: str) -> None:
    cfg = compose(config, f"trainer={trainer}", "++tbmem.sinks=[wandb,mlflow]")
    out = run_experiment(cfg, log_dir=tmp_path / "run")
    tb = tensorboard_series(str(out.log_dir))

    (wandb_file,) = wandb_run_files(offline["wandb_dir"])
    history = wandb_history(wandb_file)
    scalars = {k: v for k, v in history.items() if not isinstance(next(iter(v.values())), dict)}
    (run,) = mlflow_client.search_runs([mlflow_client.get_experiment_by_name("tbmem-test").experiment_id])
    metrics = mlflow_series(mlflow_client, run.info.run_id)
    assert scalars.keys() == metrics.keys()
    assert "Memory/RAM/process_rss_GB" in scalars and len(scalars) >= 10
    for tag in scalars:  # every tag tbmem sent: all of TensorBoard's steps and values
        assert same_as_float32(scalars[tag], tb[tag]), tag
        assert same_as_float32(metrics[tag], tb[tag]), tag
    only_tensorboard = set(tb) - set(scalars)  # the trainers' own add_scalar calls
    assert all(t.split("/")[0] in ("Loss", "Train", "Physical") for t in only_tensorboard)

    # every scalar tag defined by its own name (dots escaped), its summary the max; no glob that would
    # also match a table's fields
    defined = [r.metric for r in wandb_records(wandb_file) if r.WhichOneof("record_type") == "metric"]
    assert not [m.glob_name for m in defined if m.glob_name]
    peaks = {m.name for m in defined if m.summary.max}
    assert {metric_name(tag) for tag in scalars} <= peaks

    snapshots = sorted(p.name for p in (out.log_dir / "plugins" / "tbmem").glob("*_step*")
                       if not p.name.endswith(".pickle"))
    assert snapshots
    sent = {a.name for a in wandb_artifacts(wandb_file) if a.type == "tbmem-snapshot"}
    assert set(snapshots) <= sent  # pruned snapshots were sent too, before they were removed
    root = run.info.artifact_uri.removeprefix("file://")
    assert set(snapshots) <= set(os.listdir(os.path.join(root, "tbmem", "snapshot")))
