"""Servers the tests start on 127.0.0.1 (a real ``tensorboard``, JupyterLab): a free port, the wait until the
server answers, and the stop. Torch-free (tests/test_wheel.py runs TensorBoard from a venv without the clone)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable

__all__ = ["free_port", "stop", "wait_served", "serves_run", "serves_memory_tab", "Server"]


def free_port() -> int:
    """A port nothing listens on now (the socket that found it is closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop(proc: subprocess.Popen, timeout_s: float = 20) -> None:
    """Terminate ``proc`` and wait for it; killed when it has not ended after ``timeout_s``."""
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def wait_served(proc: subprocess.Popen, base: str, ready: Callable[[str], bool], log: Path, *,
                timeout_s: float = 120, what: str = "the server") -> None:
    """Poll ``ready(base)`` every half second until it says yes (the server is another process: there is no
    event to wait on); an ``OSError`` of the request is "not yet". Fails with the end of ``log`` when
    ``proc`` exits or ``timeout_s`` pass first."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if ready(base):
                return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            state = f"exited {proc.returncode}" if proc.poll() is not None else f"not ready in {timeout_s:g} s"
            raise AssertionError(f"{what} did not answer ({state}): {log.read_text(errors='replace')[-4000:]}")
        time.sleep(0.5)


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def serves_run(run: str) -> Callable[[str], bool]:
    """``ready`` for :func:`wait_served`: TensorBoard lists ``run`` (or a run ending in ``/run``) with scalars."""
    def ready(base: str) -> bool:
        try:
            runs = _get_json(f"{base}/data/plugin/scalars/tags")
        except urllib.error.HTTPError:
            return False
        return any((r == run or r.endswith("/" + run)) and tags for r, tags in runs.items())

    return ready


def serves_memory_tab(base: str) -> bool:
    """``ready`` for :func:`wait_served`: TensorBoard answers its plugins listing, and the Memory tab (the
    page of ``/#tbmem``) is in it, enabled (an assertion, not a wait: a listing without it is final)."""
    listing = _get_json(f"{base}/data/plugins_listing")
    assert "tbmem" in listing and listing["tbmem"]["enabled"], listing
    return True


class Server:
    """A real ``tensorboard`` on 127.0.0.1 (this venv's unless ``command`` says), stopped by :meth:`stop` or
    at the end of a ``with``.

    Args:
        tmp: Where its log goes (``tensorboard-<port>.log``).
        args: TensorBoard's own arguments (``--logdir``, ...).
        wait_run: Started when TensorBoard lists this run with scalars; None: when it lists the Memory tab.
        command: The program (default: the ``tensorboard`` beside this Python).
        cwd, env: The process's working directory and environment (default: this process's).
        timeout_s: How long it may take to start.
    """

    def __init__(self, tmp: Path, *args: str, wait_run: str | None = "train", command: list[str] | None = None,
                 cwd: Path | None = None, env: dict[str, str] | None = None, timeout_s: float = 120) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = tmp / f"tensorboard-{self.port}.log"
        command = command or [str(Path(sys.executable).with_name("tensorboard"))]
        with open(self.log, "wb") as sink:
            self.proc = subprocess.Popen([*command, *args, "--host", "127.0.0.1", "--port", str(self.port)],
                                         stdout=sink, stderr=subprocess.STDOUT, cwd=cwd, env=env)
        try:
            wait_served(self.proc, self.base, serves_memory_tab if wait_run is None else serves_run(wait_run),
                        self.log, timeout_s=timeout_s, what="tensorboard")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """End the server (terminated; killed after 20 s)."""
        stop(self.proc)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
