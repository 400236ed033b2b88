"""W&B's server accepts and never answers: the training process ends within the W&B sink's close limit
plus a margin (W&B's own init timeout, 90 s, kept it alive a minute past close())."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from tests.faults._child import finish, start_child

pytest.importorskip("wandb", reason="the W&B sink needs wandb (tbmem[wandb])")

_TRAIN = """
import sys
from tbmem import MemoryWriter
from tbmem._internal.sinks.wandb_sink import WandbSink
sink = WandbSink(project="tbmem-test", close_timeout_s=5)
with MemoryWriter(sys.argv[1], every=1, census_every=0, custom_layout=False, sinks=[sink]) as w:
    for step in range(3):
        w.log_memory(step)
print("closed", flush=True)
"""


def test_an_unanswering_wandb_server_does_not_keep_the_process_alive(tmp_path, monkeypatch):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []
    server.settimeout(0.2)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    for key, value in {"WANDB_MODE": "online", "WANDB_BASE_URL": f"http://127.0.0.1:{server.getsockname()[1]}",
                       "WANDB_API_KEY": "0" * 40, "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("WANDB_INIT_TIMEOUT", raising=False)
    try:
        began = time.monotonic()
        proc = start_child(_TRAIN, str(tmp_path / "run"))
        out, err = finish(proc, timeout=120)
        took = time.monotonic() - began
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        server.close()
    assert "closed" in out, err[-2000:]
    # the sink's limit (5 s) and W&B's service start and teardown; it was W&B's 90 s init timeout
    assert took < 60, f"the process ended {took:.0f} s after it started"
