"""Remote logdirs for real: a moto S3 server on 127.0.0.1 (started here), s3fs, a training child process.

A run written to ``s3://`` keeps every artifact there (events, census, snapshots and their pages,
the custom-scalars layout inside the events); ``tbmem report s3://...`` reads it; and a server that
stops mid-run does not stop training: one clear message, the files uploaded before stay readable.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests._servers import free_port, stop, wait_served

pytest.importorskip("s3fs", reason="remote logdirs need s3fs (tbmem[remote])")
pytest.importorskip("moto.server", reason="the local S3 server is moto's (pip install 'moto[server]')")

ROOT = Path(__file__).resolve().parents[2]
TRAIN = Path(__file__).with_name("_train_s3.py")


class Moto:
    """``python -m moto.server`` on 127.0.0.1, in memory; the environment its clients need."""

    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.env = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1",
                    "AWS_ENDPOINT_URL": f"http://127.0.0.1:{self.port}", "AWS_MAX_ATTEMPTS": "2"}
        self.log = open(tmp / "moto.log", "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        wait_served(self.proc, f"127.0.0.1:{self.port}", _listening, tmp / "moto.log", timeout_s=60, what="moto")

    def fs(self):  # noqa: ANN201
        import s3fs

        return s3fs.S3FileSystem(key="test", secret="test", client_kwargs={"endpoint_url": self.env["AWS_ENDPOINT_URL"],
                                                                           "region_name": "us-east-1"},
                                 skip_instance_cache=True)

    def stop(self) -> None:
        stop(self.proc)
        self.log.close()


def _listening(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=1):
        return True


@pytest.fixture
def moto(tmp_path):
    import boto3

    server = Moto(tmp_path)
    try:
        boto3.client("s3", endpoint_url=server.env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                     aws_access_key_id="test", aws_secret_access_key="test").create_bucket(Bucket="bucket")
        yield server
    finally:
        server.stop()


def _env(moto: Moto, tmp: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), TBMEM_REMOTE_EVERY_S="0.5", TMPDIR=str(tmp), **moto.env)
    env.pop("PYTHONWARNINGS", None)
    return env


def _tensorboard_on_s3(moto: Moto, tmp: Path, logdir: str, run: str):  # noqa: ANN202
    """A real ``tensorboard --logdir s3://...``, its own S3 client pointed at moto; once ``run`` is listed."""
    from tests.plugin._logdir import Server

    saved = dict(os.environ)
    os.environ.update(_env(moto, tmp), S3_ENDPOINT=moto.env["AWS_ENDPOINT_URL"], S3_USE_HTTPS="0", S3_VERIFY_SSL="0")
    try:
        return Server(tmp, "--logdir", logdir, "--load_fast", "false", wait_run=run)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_a_run_written_to_s3_keeps_every_artifact_and_tbmem_report_reads_it(moto, tmp_path):
    proc = subprocess.run([sys.executable, str(TRAIN), "s3://bucket/runs/exp", "8"], env=_env(moto, tmp_path),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "done 8" in proc.stdout, proc.stderr[-3000:]
    keys = [k.split("bucket/runs/exp/", 1)[1] for k in moto.fs().find("bucket/runs/exp")]
    assert any(k.startswith("events.out.tfevents.") for k in keys), keys
    assert "plugins/tbmem/census.jsonl" in keys
    snaps = [k for k in keys if k.startswith("plugins/tbmem/") and "_rank0_step" in k]
    assert {k.rsplit(".", 1)[-1] for k in snaps} >= {"gz", "html"}, keys
    assert not [k for k in keys if ".tmp-" in os.path.basename(k)]
    # the census lines on the server are every census the run took (steps 0, 2, 4, 6)
    lines = moto.fs().cat("bucket/runs/exp/plugins/tbmem/census.jsonl").decode().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [0, 2, 4, 6]
    report = subprocess.run([sys.executable, "-m", "tbmem", "report", "--json", "s3://bucket/runs/exp"],
                            env=_env(moto, tmp_path), capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr[-3000:]
    doc = json.loads(report.stdout)
    (run,) = doc["runs"]
    assert doc["logdir"] == "s3://bucket/runs/exp" and run["records"] == 8 and run["census_peak_step"] in (0, 2, 4, 6)
    assert run["last_loss"]["Loss/train"] is not None
    # the custom-scalars layout is in the events on the server
    from tests._events import read_events

    local = tmp_path / "copy"
    moto.fs().get("bucket/runs/exp/", str(local), recursive=True)
    acc = read_events(local)
    assert "Memory/RAM/process_rss_GB" in acc.Tags()["scalars"]
    assert acc.PluginTagToContent("custom_scalars")  # the layout's event


def test_the_server_stopped_mid_run_training_goes_on_with_one_message(moto, tmp_path):
    pause = tmp_path / "go"
    child = subprocess.Popen([sys.executable, str(TRAIN), "s3://bucket/runs/cut", "12", str(pause)],
                             env=_env(moto, tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not Path(str(pause) + ".ready").exists():
            assert time.monotonic() < deadline and child.poll() is None, child.stderr.read()[-3000:]
            time.sleep(0.1)
        # what the server holds before it stops: the records of steps 0..4
        fs = moto.fs()
        local = tmp_path / "before"
        fs.get("bucket/runs/cut/", str(local), recursive=True)
        from tests._events import read_events

        rss = [e.step for e in read_events(local).Scalars("Memory/RAM/process_rss_GB")]
        assert rss == [0, 1, 2, 3, 4]
        moto.stop()
        pause.touch()
        out, err = child.communicate(timeout=300)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0 and "done 12" in out, err[-3000:]
    messages = [line for line in err.splitlines() if "uploading the run to s3://bucket/runs/cut failed" in line]
    assert len(messages) == 1, err[-3000:]
    assert "training goes on, every file is kept in" in messages[0]
    kept = Path(messages[0].split("every file is kept in ", 1)[1].split(" and uploads", 1)[0])
    assert sorted(e.step for e in read_events(kept).Scalars("Memory/RAM/process_rss_GB")) == list(range(12))


def test_the_memory_tab_reads_a_run_on_s3(moto, tmp_path):
    """TensorBoard reads the events through its own S3 client (S3_ENDPOINT); the tab copies the side
    files (census, snapshots) through fsspec into a cache of its own."""
    from tests.plugin._logdir import get

    env = _env(moto, tmp_path)
    proc = subprocess.run([sys.executable, str(TRAIN), "s3://bucket/runs/exp", "6"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    srv = _tensorboard_on_s3(moto, tmp_path, "s3://bucket/runs", "exp")
    try:
        def doc(route: str):  # noqa: ANN202
            status, body, _ = get(f"{srv.base}/data/plugin/tbmem/{route}")
            assert status == 200, body[:500]
            return json.loads(body)

        (group,) = doc("runs")["groups"]
        assert group["group"] == "exp" and group["memory"] and group["census"]
        overview = doc("overview?run=exp")
        assert overview["x"] == list(range(6))
        snaps = doc("snapshots?run=exp")
        assert snaps and all(s["step"] in (0, 4) for s in snaps)  # the snapshots on the server, listed
        at = doc("at?run=exp&step=2")  # the census of step 2, from census.jsonl on the server
        assert at["census"]
    finally:
        srv.stop()


def test_a_compact_job_on_s3_keeps_its_job_run_kept_ranks_and_rank_table_and_both_readers_read_it(moto, tmp_path):
    """torchrun, 4 ranks, ``ranks={"layout": "compact"}``, the job on s3: rank 0's run, the kept rank's
    run (rank 3: the peak RSS and an alert) and the node's rank table reach the store; nothing else."""
    from tests.distributed._torchrun import torchrun
    from tests.plugin._logdir import get

    env = _env(moto, tmp_path)
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        proc = torchrun(4, ROOT / "tests/distributed/_compact_job.py", "compact", "s3://bucket/jobs/big", "3",
                        timeout=480)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-5000:]
    keys = [k.split("bucket/jobs/big/", 1)[1] for k in moto.fs().find("bucket/jobs/big")]
    assert sorted({k.split("/")[0] for k in keys}) == ["rank0", "rank3", "ranks"], keys
    assert [k for k in keys if k.startswith("ranks/")] == ["ranks/node0.parquet"]
    assert any(k.startswith("rank3/events.out.tfevents.") for k in keys)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(("tbmem-rank", "tbmem-ranks-"))] == []
    import pyarrow.parquet as pq

    local = tmp_path / "node0.parquet"
    moto.fs().get("bucket/jobs/big/ranks/node0.parquet", str(local))
    table = pq.read_table(local, columns=["rank", "step"]).to_pydict()
    assert sorted(set(zip(table["rank"], table["step"]))) == sorted(
        (r, s) for r in range(4) for s in (0, 1, 2, 1000, 1001, 1002))
    report = subprocess.run([sys.executable, "-m", "tbmem", "report", "--json", "s3://bucket/jobs/big"],
                            env=env, capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr[-3000:]
    (job,) = json.loads(report.stdout)["jobs"]
    assert job["ranks"] == [0, 1, 2, 3] and job["missing"] == []
    # the Memory tab on the store: the job's ranks from the rank table TensorBoard never sees
    srv = _tensorboard_on_s3(moto, tmp_path, "s3://bucket/jobs", "big/rank0")
    try:
        status, body, _ = get(f"{srv.base}/data/plugin/tbmem/ranks?group=big")
        assert status == 200, body[:500]
        ranks = json.loads(body)
        assert ranks["compact"] is True and [r["rank"] for r in ranks["ranks"]] == [0, 1, 2, 3]
        assert {r["rank"]: r["run"] for r in ranks["ranks"]} == {0: "big/rank0", 1: None, 2: None, 3: "big/rank3"}
        status, body, _ = get(f"{srv.base}/data/plugin/tbmem/heatmap?group=big")
        assert status == 200 and json.loads(body)["ranks"], body[:500]
    finally:
        srv.stop()
