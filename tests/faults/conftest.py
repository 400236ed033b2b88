"""Fault injection: small tmpfs mounts, read-only bind mounts and child processes.

Mounting needs root (CI runs as root). Where it is not permitted the test is
skipped with the reason, except under ``TBMEM_REQUIRE_MOUNT=1`` (set by .ci/run),
where a skip would hide a fault and fails instead. Every mount is undone after
its test, also when the test fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Callable, Iterator

import pytest

REQUIRE_MOUNT = os.environ.get("TBMEM_REQUIRE_MOUNT") == "1"


def _cannot_mount(reason: str) -> None:
    if REQUIRE_MOUNT:
        pytest.fail(f"TBMEM_REQUIRE_MOUNT=1 but mounting is not possible here: {reason}")
    pytest.skip(f"needs to mount a filesystem (root): {reason}")


def _mount(*args: str) -> None:
    proc = subprocess.run(["mount", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        _cannot_mount(f"mount {' '.join(args)}: {proc.stderr.strip()}")


def fill_disk(disk: Path) -> None:
    """Fill the filesystem of ``disk`` (a small tmpfs from :func:`mounts`) to its last byte with one file."""
    with open(disk / "filler", "wb", buffering=0) as fh:  # unbuffered: nothing left to fail at close
        try:
            while True:
                fh.write(b"\0" * 65536)
        except OSError:
            pass


@pytest.fixture
def mounts(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """``mounts(kind, size_kb=...)`` mounts a fresh tmpfs (``"tmpfs"``) or a bind mount of a new
    directory (``"bind"``) under tmp_path and returns its path; all are unmounted afterwards."""
    if os.geteuid() != 0:
        _cannot_mount("not running as root")
    if shutil.which("mount") is None:
        _cannot_mount("no mount command")
    made: list[Path] = []

    def make(kind: str, *, size_kb: int = 512) -> Path:
        target = tmp_path / f"{kind}{len(made)}"
        target.mkdir()
        if kind == "tmpfs":
            _mount("-t", "tmpfs", "-o", f"size={size_kb}k,mode=0755", "tmpfs", str(target))
        elif kind == "bind":
            source = tmp_path / f"bind-source{len(made)}"
            source.mkdir()
            _mount("--bind", str(source), str(target))
        else:
            raise ValueError(kind)
        made.append(target)
        return target

    try:
        yield make
    finally:
        for target in reversed(made):
            subprocess.run(["umount", "-l", str(target)], capture_output=True)
