"""A failing sink is reported once and switched off; training, TensorBoard and the other sink go on.

Each fault is real: an MLflow tracking server that does not answer (a closed port on 127.0.0.1)
or answers 429 to everything, a W&B run finished by its owner mid-training, a disk that fills up
under MLflow's store (a small tmpfs: root only, as tests/faults).
"""

from __future__ import annotations

import http.server
import shutil
import socket
import threading
from pathlib import Path
from typing import Iterator

import pytest
import torch

from tbmem import MemoryWriter
from tbmem._internal._log import forget_reports
from tbmem._internal.sinks import MlflowSink, WandbSink
from tests.faults.conftest import fill_disk, mounts  # noqa: F401 - mounts: the fixture

from ._readers import mlflow_series, same_as_float32, tensorboard_series, wandb_history, wandb_run_files

RSS = "Memory/RAM/process_rss_GB"
STEPS = 20


@pytest.fixture(autouse=True)
def _fresh_reports() -> Iterator[None]:
    forget_reports()
    yield
    forget_reports()


def _train(run_dir: Path, sinks: list, at_step: dict | None = None) -> None:
    model = torch.nn.Linear(16, 4)
    writer = MemoryWriter(str(run_dir), every=1, census_every=5, sinks=sinks)
    writer.watch(model)
    for step in range(STEPS):
        model(torch.randn(8, 16)).sum().backward()
        if at_step and step in at_step:
            at_step[step]()
        writer.log_memory(step)
    writer.close()


def _failures(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "tbmem" and f"the {name} sink failed" in r.getMessage()]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed when the socket is: nothing listens there


def _mlflow_fails_fast(monkeypatch: pytest.MonkeyPatch, uri: str) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")


def _wandb_complete(offline: dict, tb: dict) -> None:
    (wandb_file,) = wandb_run_files(offline["wandb_dir"])
    assert same_as_float32(wandb_history(wandb_file)[RSS], tb[RSS])


def test_an_unreachable_tracking_server_is_one_line_and_the_rest_goes_on(
        tmp_path: Path, offline: dict, monkeypatch: pytest.MonkeyPatch, tbmem_log: pytest.LogCaptureFixture) -> None:
    _mlflow_fails_fast(monkeypatch, f"http://127.0.0.1:{_closed_port()}")
    _train(tmp_path / "run", ["mlflow", "wandb"])
    tb = tensorboard_series(str(tmp_path / "run"))
    assert sorted(tb[RSS]) == list(range(STEPS))
    (line,) = _failures(tbmem_log, "mlflow")
    assert "127.0.0.1" in line and "TensorBoard's records are complete" in line
    _wandb_complete(offline, tb)


def test_an_unreachable_wandb_server_is_one_line_and_mlflow_goes_on(
        tmp_path: Path, offline: dict, mlflow_client, monkeypatch: pytest.MonkeyPatch,
        tbmem_log: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "5")
    _train(tmp_path / "run", ["wandb", "mlflow"])
    tb = tensorboard_series(str(tmp_path / "run"))
    assert sorted(tb[RSS]) == list(range(STEPS))
    (line,) = _failures(tbmem_log, "wandb")
    assert "127.0.0.1" in line and "connection refused" in line
    (run,) = mlflow_client.search_runs([mlflow_client.get_experiment_by_name("tbmem-test").experiment_id])
    assert same_as_float32(mlflow_series(mlflow_client, run.info.run_id)[RSS], tb[RSS])


class _TooManyRequests(http.server.BaseHTTPRequestHandler):
    def _refuse(self) -> None:
        self.send_response(429, "Too Many Requests")
        self.send_header("Retry-After", "60")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = _refuse

    def log_message(self, *args: object) -> None:
        pass


def test_a_rate_limit_429_is_one_line_and_the_rest_goes_on(
        tmp_path: Path, offline: dict, monkeypatch: pytest.MonkeyPatch, tbmem_log: pytest.LogCaptureFixture) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _TooManyRequests)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        _mlflow_fails_fast(monkeypatch, f"http://127.0.0.1:{server.server_address[1]}")
        _train(tmp_path / "run", ["mlflow", "wandb"])
    finally:
        server.shutdown()
        server.server_close()
    tb = tensorboard_series(str(tmp_path / "run"))
    assert sorted(tb[RSS]) == list(range(STEPS))
    (line,) = _failures(tbmem_log, "mlflow")
    assert "429" in line
    _wandb_complete(offline, tb)


def test_a_wandb_run_finished_mid_training_is_one_line_and_mlflow_goes_on(
        tmp_path: Path, offline: dict, mlflow_client, tbmem_log: pytest.LogCaptureFixture) -> None:
    import wandb

    run = wandb.init(project="mine", reinit="create_new")
    sink = WandbSink(run=run, flush_every_s=0.05)
    _train(tmp_path / "run", [sink, "mlflow"], at_step={10: run.finish})
    tb = tensorboard_series(str(tmp_path / "run"))
    assert sorted(tb[RSS]) == list(range(STEPS))
    (line,) = _failures(tbmem_log, "wandb")
    assert "finished" in line
    assert sink.off
    (mlflow_run,) = mlflow_client.search_runs([mlflow_client.get_experiment_by_name("tbmem-test").experiment_id])
    assert same_as_float32(mlflow_series(mlflow_client, mlflow_run.info.run_id)[RSS], tb[RSS])


def test_a_full_disk_under_mlflows_store_is_one_line_and_the_rest_goes_on(
        tmp_path: Path, offline: dict, mounts, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        tbmem_log: pytest.LogCaptureFixture) -> None:
    from mlflow.tracking import MlflowClient

    disk = mounts("tmpfs", size_kb=1024)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{disk}/mlflow.db")
    client = MlflowClient()
    client.create_experiment("tbmem-test", artifact_location=(disk / "artifacts").as_uri())
    sink = MlflowSink(flush_every_s=0.05)

    _train(tmp_path / "run", [sink, "wandb"], at_step={10: lambda: fill_disk(disk)})
    tb = tensorboard_series(str(tmp_path / "run"))
    assert sorted(tb[RSS]) == list(range(STEPS))
    (line,) = _failures(tbmem_log, "mlflow")
    assert "full" in line.lower() or "space" in line.lower(), line
    assert sink.off
    _wandb_complete(offline, tb)


def test_a_full_disk_under_wandbs_run_folder_is_one_line_and_mlflow_goes_on(
        tmp_path: Path, offline: dict, mlflow_client, mounts, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        tbmem_log: pytest.LogCaptureFixture) -> None:
    # W&B's service swallows ENOSPC (wandb.log neither raises nor returns anything): the sink reads
    # the free space under the run's folder after each batch
    disk = mounts("tmpfs", size_kb=65536)
    monkeypatch.setenv("WANDB_DIR", str(disk))
    sink = WandbSink(flush_every_s=0.05)

    def fill() -> None:
        assert shutil.disk_usage(disk).used < 32 * 2**20  # W&B's own files fit: the fill is what fails it
        fill_disk(disk)

    _train(tmp_path / "run", [sink, "mlflow"], at_step={10: fill})
    tb = tensorboard_series(str(tmp_path / "run"))
    assert sorted(tb[RSS]) == list(range(STEPS))
    (line,) = _failures(tbmem_log, "wandb")
    # W&B's own message comes only when a census table's media file fails to copy; scalars are lost in silence
    assert f"the disk under W&B's run folder {disk}" in line and "is full" in line, line
    assert sink.off
    (mlflow_run,) = mlflow_client.search_runs([mlflow_client.get_experiment_by_name("tbmem-test").experiment_id])
    assert same_as_float32(mlflow_series(mlflow_client, mlflow_run.info.run_id)[RSS], tb[RSS])
