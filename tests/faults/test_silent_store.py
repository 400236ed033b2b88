"""A store that accepts connections and never answers (a TCP server on 127.0.0.1 that stays silent, the S3
endpoint pointed at it): close() keeps one deadline and names the folder that keeps the run, a slow round
is one line, and `tbmem report s3://...` ends with a message, leaving nothing in the temporary folder."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("s3fs", reason="remote logdirs need s3fs (tbmem[remote])")

from tests.faults._child import REPO, child_env


@pytest.fixture
def silent_store(monkeypatch):
    """An endpoint that accepts and never answers; the environment S3 clients need to use it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])  # kept open, never read nor answered
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{server.getsockname()[1]}", "AWS_ACCESS_KEY_ID": "test",
           "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1", "TBMEM_REMOTE_TIMEOUT_S": "2"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    yield env
    stop.set()
    thread.join(5)
    for conn in held:
        conn.close()
    server.close()


def test_close_keeps_one_deadline_and_names_the_kept_folder(silent_store, tmp_path, monkeypatch, caplog):
    from tbmem._internal.logdir import fs

    monkeypatch.setenv("TBMEM_REMOTE_TIMEOUT_S", "30")  # a round outlasts close()'s deadline
    local = tmp_path / "mirror"
    (local / "plugins").mkdir(parents=True)
    (local / "events.out.tfevents.1").write_bytes(b"x" * 100)
    mirror = fs.RemoteMirror("s3://bucket/closing-run", str(local), every_s=0.1)
    time.sleep(0.5)  # the mirror's thread is in a round the store never answers
    began = time.monotonic()
    assert mirror.close(timeout_s=6) is False
    took = time.monotonic() - began
    assert took < 6 * 1.5, f"close() took {took:.1f} s for a deadline of 6 s"
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any(str(local) in m and "s3://bucket/closing-run" in m and "close()" in m for m in said), said


def test_an_upload_round_that_overruns_is_one_line(silent_store, tmp_path, monkeypatch, caplog):
    from tbmem._internal.logdir import fs

    monkeypatch.setattr(fs, "ROUND_WARN_S", 0.5)
    local = tmp_path / "mirror"
    local.mkdir()
    (local / "events.out.tfevents.1").write_bytes(b"x")
    mirror = fs.RemoteMirror("s3://bucket/slow-run", str(local), every_s=0)
    assert mirror.sync() is False and mirror.sync() is False  # each bounded (the read timeout: 2 s)
    said = [r.getMessage() for r in caplog.records if "took" in r.getMessage() and str(local) in r.getMessage()]
    assert len(said) == 1, said


def test_report_on_a_silent_store_ends_with_a_message_and_leaves_no_copy(silent_store, tmp_path):
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = dict(child_env(), **silent_store, TMPDIR=str(temp))
    try:
        done = subprocess.run([sys.executable, "-m", "tbmem", "report", "s3://bucket/runs"], check=False,
                              capture_output=True, text=True, timeout=120, env=env, cwd=str(REPO))
    except subprocess.TimeoutExpired:
        pytest.fail("tbmem report on a silent store ran past 120 s")
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines and "s3://bucket/runs" in lines[-1], done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert os.listdir(temp) == []


def test_report_on_s3_leaves_nothing_in_the_temporary_folder(tmp_path):
    pytest.importorskip("moto.server", reason="the local S3 server is moto's (pip install 'moto[server]')")
    import boto3

    from tbmem import MemoryWriter
    from tests.remote.test_s3 import Moto

    run = tmp_path / "local" / "exp"
    with MemoryWriter(run, every=1, census_every=0, custom_layout=False) as w:
        for step in range(3):
            w.log_memory(step)
    server = Moto(tmp_path)
    try:
        boto3.client("s3", endpoint_url=server.env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                     aws_access_key_id="test", aws_secret_access_key="test").create_bucket(Bucket="bucket")
        fs = server.fs()
        fs.put(str(run) + "/", "bucket/runs/exp/", recursive=True)
        temp = tmp_path / "tmp"
        temp.mkdir()
        env = dict(child_env(), **server.env, TMPDIR=str(temp))
        for _ in range(2):
            done = subprocess.run([sys.executable, "-m", "tbmem", "report", "s3://bucket/runs"], check=False,
                                  capture_output=True, text=True, timeout=180, env=env, cwd=str(REPO))
            assert done.returncode == 0 and "exp" in done.stdout, done.stderr[-2000:]
        assert os.listdir(temp) == [], "a copy of the logdir was left in the temporary folder"
    finally:
        server.stop()
