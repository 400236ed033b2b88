"""A packaged tbmem is whole: the wheel and the sdist built from the clone, the wheel installed alone in a
fresh venv outside the clone, and from a folder outside the clone the README's Quickstart, ``tbmem report``,
``tbmem snapshot html``, the CPU recorder's build and a TensorBoard whose plugins list the Memory tab.

The wheel holds the compiled C extensions and the CPU recorder's C++ source, and no top-level package
but ``tbmem`` (the demo trainers stay in the repository's ``trainers/``). The fresh venv (no system site
packages) gets the wheel by pip, without its dependencies from an index: they are the test runner's own
installed distributions, seen through one ``.pth`` file (every top-level entry of the runner's
site-packages but tbmem's own, linked), and ``pip check`` confirms they satisfy the wheel's requirements.
``TBMEM_WHEEL_FULL_INSTALL=1`` installs them by pip instead, from the local package mirror (pip's
configuration; about 8 minutes here under load: torch is most of it). One test, about a minute: the
steps share the wheel and the venv.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import urllib.request
import zipfile
from pathlib import Path

import pytest

from tests._servers import Server

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

_QUICKSTART_PRELUDE = '''
import torch
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
optimizer = torch.optim.Adam(model.parameters())
loader = [torch.randn(4, 8) for _ in range(21)]
def train_step(batch):
    optimizer.zero_grad()
    loss = model(batch).square().mean()
    loss.backward()
    optimizer.step()
    return loss.item()
'''


def _clone_files(dest: Path) -> None:
    """The clone's files as a fresh clone has them (tracked and new, nothing git ignores: no build/, no .so)."""
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                         capture_output=True).stdout.decode()
    for rel in filter(None, out.split("\0")):
        src = ROOT / rel
        if src.is_file() and not src.is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def _run(cmd: list[str], *, cwd: Path, env: dict[str, str], timeout: float = 300) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout + proc.stderr


def _quickstart() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


def _link_dependencies(venv_python: Path, deps: Path) -> None:
    """The runner's installed distributions, less tbmem, importable in the fresh venv through one .pth file."""
    site = Path(sysconfig.get_paths()["purelib"])
    deps.mkdir()
    for entry in site.iterdir():
        name = entry.name.lower()
        if name.startswith(("tbmem", "__editable__", "trainers", "_distutils_hack", "distutils-precedence")) \
                or name.endswith(".pth") or name == "__pycache__":
            continue
        (deps / entry.name).symlink_to(entry)
    target = subprocess.run([str(venv_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                            check=True, capture_output=True, text=True).stdout.strip()
    Path(target, "runner-dependencies.pth").write_text(f"{deps}\n")


def _plugins_listing(venv: Path, logdir: Path, cwd: Path, env: dict[str, str], tmp: Path) -> dict:
    script = venv / "bin" / "tensorboard"  # pip writes it with tensorboard (the full install); else its module
    tensorboard = [str(script)] if script.exists() else [str(venv / "bin" / "python"), "-m", "tensorboard.main"]
    with Server(tmp, "--logdir", str(logdir), wait_run=None, command=tensorboard, cwd=cwd, env=env) as srv:
        with urllib.request.urlopen(f"{srv.base}/data/plugins_listing", timeout=5) as r:
            return json.loads(r.read())


def test_the_wheel_and_sdist_build_and_the_wheel_works_alone_outside_the_clone(tmp_path) -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git clone: the files of a fresh clone cannot be listed")
    src, dist, work = tmp_path / "src", tmp_path / "dist", tmp_path / "elsewhere"
    src.mkdir()
    work.mkdir()
    _clone_files(src)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")  # the recorder is built afresh, from the wheel's source
    env["PIP_NO_INPUT"] = "1"

    # the wheel (C extensions compiled) and the sdist, offline, with this venv's setuptools
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), "."],
         cwd=src, env=env, timeout=600)
    _run([sys.executable, "-c", f"from setuptools import build_meta; build_meta.build_sdist({str(dist)!r})"],
         cwd=src, env=env)
    wheel, = dist.glob("tbmem-*.whl")
    sdist, = dist.glob("tbmem-*.tar.gz")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names}
    assert tops == {"tbmem", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}, tops
    assert "tbmem/_internal/snapshot/_cpu_alloc_recorder.cpp" in names
    ext = sysconfig.get_config_var("EXT_SUFFIX")
    assert {f"tbmem/_internal/census/_gcwalk{ext}", f"tbmem/_internal/snapshot/_creader{ext}"} <= set(names)
    assert not [n for n in names if n.endswith((".c", ".h"))]
    # every file of the package the clone tracks (tbmem/_internal/: the viewer's and the plugin's static files,
    # the CPU recorder's source) but the C sources the wheel holds compiled
    tracked = subprocess.run(["git", "ls-files", "tbmem"], cwd=ROOT, check=True, capture_output=True,
                             text=True).stdout.split()
    assert {"tbmem/__main__.py", "tbmem/_internal/snapshot/viewer.html", "tbmem/_internal/plugin/static/index.js",
            "tbmem/_internal/plugin/static/vendor/uplot/uPlot.iife.min.js"} <= set(tracked)
    assert sorted(set(t for t in tracked if not t.endswith((".c", ".h"))) - set(names)) == []
    assert not [n for n in names if n.startswith("tbmem/") and n.endswith(".py")
                and not n.startswith(("tbmem/_internal/", "tbmem/console/", "tbmem/integrations/"))
                and n not in ("tbmem/__init__.py", "tbmem/__main__.py", "tbmem/analysis/__init__.py",
                              "tbmem/forecast/__init__.py")]
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/entry_points.txt")))
    assert "tbmem = tbmem._internal.cli:main" in entry_points.decode()
    assert "tbmem = tbmem._internal.plugin.loader:MemoryPluginLoader" in entry_points.decode()
    with tarfile.open(sdist) as tar:
        members = {m.name.split("/", 1)[1] for m in tar.getmembers() if "/" in m.name}
    assert {"setup.py", "pyproject.toml", "tbmem/_internal/census/_gcwalk.c", "tbmem/_internal/snapshot/_creader.h",
            "tbmem/_internal/snapshot/_pickle_run.c", "tbmem/_internal/snapshot/_cpu_alloc_recorder.cpp"} <= members
    assert not [m for m in members if m.startswith("trainers/")]

    # a fresh venv outside the clone, the wheel alone in it
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=work, env=env)
    py, bindir = venv / "bin" / "python", venv / "bin"
    pip = [sys.executable, "-m", "pip", "--python", str(py)]
    if os.environ.get("TBMEM_WHEEL_FULL_INSTALL") == "1":
        _run([*pip, "install", "-q", "--no-compile", str(wheel)], cwd=work, env=env, timeout=1800)
    else:
        _link_dependencies(py, tmp_path / "deps")
        _run([*pip, "install", "-q", "--no-deps", "--no-index", str(wheel)], cwd=work, env=env)
    _run([*pip, "check"], cwd=work, env=env)
    probe = "import tbmem, importlib.util; print(tbmem.__file__); print(importlib.util.find_spec('trainers'))"
    where = _run([str(py), "-c", probe], cwd=work, env=env)
    assert str(venv) in where.splitlines()[0] and where.splitlines()[1] == "None", where

    # the README's Quickstart, as written, around a tiny model
    (work / "quickstart.py").write_text(_QUICKSTART_PRELUDE + _quickstart())
    _run([str(py), "-W", "error::DeprecationWarning:tbmem", "quickstart.py"], cwd=work, env=env)
    assert list((work / "runs" / "exp").glob("events.out.tfevents.*"))
    report = _run([str(bindir / "tbmem"), "report", "runs"], cwd=work, env=env)
    assert "exp" in report and "MiB" in report, report
    assert _run([str(py), "-m", "tbmem", "report", "runs"], cwd=work, env=env) == report  # python -m tbmem

    # tbmem snapshot html on a torch snapshot pickle
    from benchmarks.bench_snapshot import write_torch_pickle

    with open(work / "s.pickle", "wb") as fh:
        write_torch_pickle(fh, n_entries=3000)
    _run([str(bindir / "tbmem"), "snapshot", "html", "s.pickle", "-o", "s.html"], cwd=work, env=env)
    assert (work / "s.html").stat().st_size > 20_000

    # the CPU recorder, compiled from the wheel's source for the installed torch
    if shutil.which("c++") or shutil.which("g++"):
        built = _run([str(bindir / "tbmem"), "snapshot", "build-recorder"], cwd=work, env=env)
        assert "CPU allocation recorder ready" in built and str(tmp_path / "cache") in built, built

    # tbmem forecast names what it needs in one line (the demo trainers are the clone's)
    proc = subprocess.run([str(bindir / "tbmem"), "forecast"], cwd=work, env=env, capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 2 and "clone" in proc.stderr, proc.stderr

    # TensorBoard from the venv lists the Memory tab
    listing = _plugins_listing(venv, work / "runs", work, env, tmp_path)
    assert "tbmem" in listing and listing["tbmem"]["enabled"], listing
