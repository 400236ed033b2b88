"""Child processes for fault tests: run or start fresh Pythons on this checkout, read what they left."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Callable

__all__ = ["REPO", "child_env", "run_child", "start_child", "finish", "wait_for_line", "tbmem_lines",
           "event_records", "steps_of"]

REPO = Path(__file__).resolve().parents[2]


def child_env() -> dict[str, str]:
    """The environment of a child process: this checkout first on the path, warnings as errors."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PYTHONWARNINGS"] = "error,ignore::DeprecationWarning"
    env.pop("TBMEM_LOGDIR", None)
    return env


def run_child(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``code`` (dedented) in a fresh Python; a hang fails the test after ``timeout`` seconds."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True,
                          text=True, env=child_env(), timeout=timeout, cwd=str(REPO))


def start_child(code: str, *args: str) -> subprocess.Popen[str]:
    """Start ``code`` in a fresh Python with line-buffered pipes (for tests that send signals)."""
    return subprocess.Popen([sys.executable, "-u", "-c", textwrap.dedent(code), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=child_env(), cwd=str(REPO))


def finish(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[str, str]:
    """The child's (stdout, stderr) once it ends; a child still running after ``timeout`` s is killed
    and the test fails (a run that never exits is the fault some of these tests look for)."""
    rest = getattr(proc, "_rest", "")
    try:
        out, err = proc.communicate(timeout=timeout)
        return rest + out, err
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"the child did not end within {timeout} s; stderr:\n{err[-3000:]}") from None


def wait_for_line(proc: subprocess.Popen[str], predicate: Callable[[str], bool], *,
                  timeout: float = 120) -> list[str]:
    """Read the child's stdout until a line satisfies ``predicate``; return the lines read.

    Reads the pipe's file descriptor with a deadline (a child that hangs silently fails the
    test instead of blocking it); what is read past the line is kept for :func:`finish`.
    """
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    buffer = getattr(proc, "_rest", "")
    lines: list[str] = []
    while True:
        while "\n" in buffer:
            line, buffer = buffer.split("\n", 1)
            lines.append(line)
            if predicate(line):
                proc._rest = buffer  # type: ignore[attr-defined]
                return lines
        remaining = deadline - time.monotonic()
        ready = select.select([fd], [], [], max(0.0, remaining))[0] if remaining > 0 else []
        chunk = os.read(fd, 65536).decode() if ready else None
        if not chunk:
            proc.kill()
            _, err = proc.communicate()
            why = "ended" if chunk == "" else f"printed nothing for {timeout} s"
            raise AssertionError(f"the child {why} before the expected line; last lines {lines[-5:]}; "
                                 f"stderr:\n{err[-3000:]}")
        buffer += chunk


def tbmem_lines(stderr: str) -> list[str]:
    """The lines tbmem logged (its logger prints ``tbmem: ...`` through logging's last resort)."""
    return [line for line in stderr.splitlines() if line.startswith("tbmem:")]


def event_records(run_dir: Path) -> list:
    """Every Event record of every event file in ``run_dir``, read with TensorBoard's loader."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    out = []
    for name in sorted(os.listdir(run_dir)):
        if name.startswith("events.out.tfevents"):
            out += list(EventFileLoader(str(run_dir / name)).Load())
    return out


def steps_of(run_dir: Path, tag: str) -> list[int]:
    """Steps of every value of ``tag`` on disk, in file order (duplicates kept)."""
    return [e.step for e in event_records(run_dir) if e.HasField("summary")
            for v in e.summary.value if v.tag == tag]
