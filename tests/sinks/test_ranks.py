"""Sinks under torchrun (2 ranks, gloo): rank 0's run only, or a run per rank grouped by the job."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.distributed._torchrun import torchrun

from ._readers import (mlflow_series, same_as_float32, tensorboard_series, wandb_history, wandb_records,
                       wandb_run_files)

RSS = "Memory/RAM/process_rss_GB"
JOB = Path(__file__).with_name("_rank_job.py")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["rank0", "per_rank"])
def test_rank_modes(tmp_path: Path, offline: dict, mlflow_client, mode: str) -> None:
    job = tmp_path / "job"
    proc = torchrun(2, JOB, mode, str(job), timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [0] if mode == "rank0" else [0, 1]

    runs = {}
    for path in wandb_run_files(offline["wandb_dir"]):
        (run,) = [r.run for r in wandb_records(path) if r.WhichOneof("record_type") == "run"][:1]
        runs[run.display_name] = (run, path)
    names = {"job": 0} if mode == "rank0" else {"job-rank0": 0, "job-rank1": 1}
    assert set(runs) == set(names)
    experiment = mlflow_client.get_experiment_by_name("tbmem-test").experiment_id
    mlflow_runs = {int(r.data.tags["tbmem.rank"]): r for r in mlflow_client.search_runs([experiment])}
    assert sorted(mlflow_runs) == ranks
    for name, rank in names.items():
        tb = tensorboard_series(str(job / f"rank{rank}"))
        run, path = runs[name]
        if mode == "per_rank":
            assert run.run_group == "job"
        history = wandb_history(path)
        metrics = mlflow_series(mlflow_client, mlflow_runs[rank].info.run_id)
        assert history.keys() == metrics.keys() == tb.keys()
        for tag in tb:  # rank 0's run has the cross-rank aggregates too (Ranks/...)
            assert same_as_float32(history[tag], tb[tag]) and same_as_float32(metrics[tag], tb[tag]), tag
        assert any(t.startswith("Ranks/") for t in tb) == (rank == 0)
