"""The vendored uPlot is the npm package's built files, unchanged, with its licence."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import tbmem._internal.plugin

VENDOR = Path(tbmem._internal.plugin.__file__).parent / "static" / "vendor" / "uplot"


def test_vendored_files_match_their_manifest_and_licence():
    manifest = (VENDOR / "VERSION").read_text().splitlines()
    assert manifest[0].startswith("uplot 1.6.32 ") and manifest[1].startswith("integrity sha512-")
    sums = dict(reversed(line.split()) for line in manifest[2:])
    assert set(sums) == {"LICENSE", "uPlot.iife.min.js", "uPlot.min.css"}
    for name, digest in sums.items():
        assert hashlib.sha256((VENDOR / name).read_bytes()).hexdigest() == digest, name
    assert "MIT License" in (VENDOR / "LICENSE").read_text()
    assert (VENDOR / "uPlot.iife.min.js").read_text().startswith("/*! https://github.com/leeoniya/uPlot (v1.6.32) */")


def test_the_wheel_ships_the_static_files_and_the_entry_point(tmp_path):
    root = Path(__file__).resolve().parents[2]
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(root / name, src / name)
    for pkg in ("tbmem", "trainers"):
        shutil.copytree(root / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(src),
                    "-w", str(tmp_path / "dist")], check=True, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("tbmem-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        entry_points = zf.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    for f in ("index.js", "chart.js", "util.js", "style.css", "vendor/uplot/uPlot.iife.min.js", "vendor/uplot/uPlot.min.css",
              "vendor/uplot/LICENSE"):
        assert f"tbmem/_internal/plugin/static/{f}" in names
    assert "[tensorboard_plugins]\ntbmem = tbmem._internal.plugin.loader:MemoryPluginLoader" in entry_points
