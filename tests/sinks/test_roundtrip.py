"""The same readings everywhere: W&B's offline run file and MLflow's store hold every value and step
TensorBoard's event file holds, census tables as tables, snapshots as artifacts that open."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import torch

from tbmem import MemoryWriter
from tbmem._internal.sinks import MlflowSink, WandbSink
from tbmem._internal.tags import TAGS

from ._readers import (mlflow_series, same_as_float32, tensorboard_series, wandb_artifacts, wandb_history,
                       wandb_run_files)


CENSUS_TEXT = TAGS["census_text"].tag


def _train(run_dir: Path, sinks: list, steps: int = 12) -> MemoryWriter:
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    writer = MemoryWriter(str(run_dir), every=2, census_every=4, sinks=sinks,
                          snapshot={"every": 8, "window": 2, "html": True})
    writer.watch(model, opt)
    for step in range(steps):
        loss = model(torch.randn(16, 32)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        writer.add_scalar("Loss/train", loss.item(), step)  # the user's own scalar: TensorBoard only
        writer.log_memory(step)
    writer.close()
    return writer


def test_wandb_and_mlflow_hold_what_tensorboard_holds(tmp_path: Path, offline: dict, mlflow_client) -> None:
    run_dir = tmp_path / "run"
    _train(run_dir, ["wandb", "mlflow"])
    tb = tensorboard_series(str(run_dir))
    ours = {tag: series for tag, series in tb.items() if tag != "Loss/train"}
    assert "Memory/RAM/process_rss_GB" in ours and any(t.startswith("Memory/Tensor_Census/") for t in ours)
    assert len(ours["Memory/RAM/process_rss_GB"]) == 6  # steps 0, 2, ..., 10

    (wandb_file,) = wandb_run_files(offline["wandb_dir"])
    history = wandb_history(wandb_file)
    wandb_scalars = {k: v for k, v in history.items() if not isinstance(next(iter(v.values())), dict)}
    assert wandb_scalars.keys() == ours.keys()
    for tag, series in ours.items():
        assert same_as_float32(wandb_scalars[tag], series), tag

    (run,) = mlflow_client.search_runs([mlflow_client.get_experiment_by_name("tbmem-test").experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    metrics = mlflow_series(mlflow_client, run.info.run_id)
    assert metrics.keys() == ours.keys()
    for tag, series in ours.items():
        assert same_as_float32(metrics[tag], series), tag


def test_census_tables_and_snapshot_artifacts(tmp_path: Path, offline: dict, mlflow_client) -> None:
    run_dir = tmp_path / "run"
    writer = _train(run_dir, ["wandb", "mlflow"])
    snapshots = sorted(p for p in os.listdir(run_dir / "plugins" / "tbmem") if p.startswith("snapshot_"))
    assert any(p.endswith(".html") for p in snapshots) and any(p.endswith(".json.gz") for p in snapshots)
    census_steps = [0, 4, 8]

    found = wandb_run_files(offline["wandb_dir"])
    assert len(found) == 1, (os.listdir(offline["wandb_dir"]), os.listdir(offline["wandb_dir"] + "/wandb"))
    (wandb_file,) = found
    tables = wandb_history(wandb_file)[CENSUS_TEXT]
    assert sorted(tables) == census_steps
    for step, ref in tables.items():
        assert ref["_type"] == "table-file" and ref["ncols"] == 7
        table = json.loads((Path(wandb_file).parent / "files" / ref["path"]).read_text())
        assert table["columns"] == ["#", "name", "category", "shape", "dtype", "device", "MB"]
        assert table["data"][0][0] == 1 and table["data"][0][6] > 0
    # W&B adds an artifact of its own per logged table (type run_table)
    artifacts = {a.name: a for a in wandb_artifacts(wandb_file) if a.type != "run_table"}
    assert set(artifacts) == set(snapshots)
    for name, artifact in artifacts.items():
        assert artifact.type == "tbmem-snapshot"
        (entry,) = artifact.manifest.contents
        _opens(entry.local_path, name)

    (run,) = mlflow_client.search_runs([mlflow_client.get_experiment_by_name("tbmem-test").experiment_id])
    root = run.info.artifact_uri.removeprefix("file://")
    texts = sorted(os.listdir(os.path.join(root, "tbmem", *CENSUS_TEXT.split("/"))))
    assert texts == [f"step_{s:09d}.md" for s in census_steps]
    first = Path(root, "tbmem", *CENSUS_TEXT.split("/"), texts[0]).read_text()
    assert "| # | name | category |" in first
    assert sorted(os.listdir(os.path.join(root, "tbmem", "snapshot"))) == snapshots
    for name in snapshots:
        _opens(os.path.join(root, "tbmem", "snapshot", name), name)
    assert writer.faults.total_dropped() == 0 if hasattr(writer.faults, "total_dropped") else True


def _opens(path: str, name: str) -> None:
    if name.endswith(".json.gz"):
        with gzip.open(path, "rt") as fh:
            assert json.load(fh)["kind"] == "snapshot"
    else:
        text = Path(path).read_text()
        assert text.startswith("<!DOCTYPE html>") and "tbmem" in text


def test_joined_runs_are_used_and_left_open(tmp_path: Path, offline: dict, mlflow_client) -> None:
    import wandb

    wandb_run = wandb.init(project="mine", name="users-run", reinit="create_new")
    experiment = mlflow_client.get_experiment_by_name("tbmem-test").experiment_id
    mlflow_run = mlflow_client.create_run(experiment, run_name="users-run")
    wandb_run.log({"user/loss": 1.0})
    _train(tmp_path / "run", [WandbSink(run=wandb_run), MlflowSink(run_id=mlflow_run.info.run_id)], steps=6)
    assert not wandb_run._is_finished
    assert mlflow_client.get_run(mlflow_run.info.run_id).info.status == "RUNNING"
    wandb_run.finish()
    wandb.teardown()  # W&B's service has written the whole run file once it has ended
    tb = tensorboard_series(str(tmp_path / "run"))
    (wandb_file,) = wandb_run_files(offline["wandb_dir"])
    history = wandb_history(wandb_file)
    assert same_as_float32(history["Memory/RAM/process_rss_GB"], tb["Memory/RAM/process_rss_GB"])
    assert "user/loss" in history
    metrics = mlflow_series(mlflow_client, mlflow_run.info.run_id)
    assert same_as_float32(metrics["Memory/RAM/process_rss_GB"], tb["Memory/RAM/process_rss_GB"])


def test_profile_traces_are_artifacts_of_both_trackers(tmp_path: Path, offline: dict, mlflow_client) -> None:
    run_dir = tmp_path / "run"
    model = torch.nn.Linear(32, 4)
    writer = MemoryWriter(str(run_dir), every=1, sinks=["wandb", "mlflow"],
                          profile={"start": 2, "every": 4, "steps": 2, "max_windows": 2})
    writer.watch(model)
    for step in range(10):
        writer.begin_step(step)
        model(torch.randn(16, 32)).sum().backward()
        writer.log_memory(step)
    writer.close()
    # one folder per window (plugins/tbmem/traces/step<s>/), each file named by its rank and step
    # one folder per window (plugins/tbmem/traces/step<s>/rank<r>...), sent as step<s>_rank<r>...: both kept
    traces = sorted(f"{p.parent.name}_{p.name}"
                    for p in (run_dir / "plugins" / "tbmem" / "traces").glob("step*/*.pt.trace.json*"))
    assert len(traces) == 2, traces

    (wandb_file,) = wandb_run_files(offline["wandb_dir"])
    artifacts = {a.name: a for a in wandb_artifacts(wandb_file) if a.type == "tbmem-trace"}
    assert set(artifacts) == set(traces)
    for name, artifact in artifacts.items():
        (entry,) = artifact.manifest.contents
        with gzip.open(entry.local_path, "rt") as fh:
            assert json.load(fh)["traceEvents"], name

    (run,) = mlflow_client.search_runs([mlflow_client.get_experiment_by_name("tbmem-test").experiment_id])
    root = run.info.artifact_uri.removeprefix("file://")
    assert sorted(os.listdir(os.path.join(root, "tbmem", "trace"))) == traces
