"""README's notebook commands, as written there, after ``make demo``: ``jupyter nbconvert --execute`` runs
the notebook headless on the demo's logdir, and ``jupyter lab`` serves it (the ``notebook`` extra)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from tests._demo import ROOT
from tests._servers import free_port, stop, wait_served

# No importorskip: a missing jupyterlab or nbconvert is the failure these tests are for (`make` installs
# the `notebook` extra).
BIN = Path(sys.executable).parent


def _readme_command(tool: str) -> list[str]:
    """The README's ``.venv/bin/jupyter <tool> ...`` line, comment removed, with this venv's jupyter."""
    lines = [ln for ln in (ROOT / "README.md").read_text().splitlines() if f"/jupyter {tool} " in ln]
    assert len(lines) == 1, lines
    words = shlex.split(lines[0], comments=True)
    assert words[0] == ".venv/bin/jupyter", words
    return [str(BIN / "jupyter"), *words[1:]]


def _project_like_a_clone(tmp_path: Path, demo_logdir: Path) -> Path:
    """A folder laid out as the repository after ``make demo`` (the notebook finds ``runs/`` from the
    folder holding ``pyproject.toml`` and ``tbmem/``), without writing into the repository."""
    proj = tmp_path / "clone"
    (proj / "tbmem").mkdir(parents=True)
    (proj / "pyproject.toml").write_text("")
    (proj / "notebooks").mkdir()
    (proj / "notebooks" / "memory_analysis.ipynb").write_bytes((ROOT / "notebooks" / "memory_analysis.ipynb").read_bytes())
    os.symlink(ROOT / "notebooks" / "templates", proj / "notebooks" / "templates")  # the offline export template
    (proj / "runs").mkdir()
    for experiment in demo_logdir.iterdir():
        os.symlink(experiment, proj / "runs" / experiment.name)
    return proj


def test_readme_nbconvert_command_runs_the_notebook_on_the_demo_logdir(tmp_path, demo_logdir):
    proj = _project_like_a_clone(tmp_path, demo_logdir)
    env = {k: v for k, v in os.environ.items() if k != "TBMEM_LOGDIR"}  # the default: runs/ of the clone
    env["JUPYTER_RUNTIME_DIR"] = str(tmp_path / "runtime")
    done = subprocess.run(_readme_command("nbconvert"), cwd=proj, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    html = (proj / "runs" / "memory_analysis.html").read_text()
    runs = sorted(f"{e.name}/{r.name}" for e in demo_logdir.iterdir() for r in e.iterdir())
    assert f"analysing {proj / 'runs'}" in html
    assert f"runs: {', '.join(runs)}" in html
    assert 'data-mime-type="application/vnd.jupyter.stderr"' not in html  # no warning, no error in any cell
    assert len(re.findall(r'<img [^>]*src="data:image/png;base64,', html)) >= 5  # the figures, inline
    # readable offline: nothing loaded from a CDN (the lab template's require.js, MathJax and mermaid)
    assert not re.findall(r'<(?:script|link)[^>]+(?:src|href)="(?:https?:)?//', html)
    assert "require.min.js" not in html and "MathJax.js" not in html and "mathjax/" not in html.lower()


def test_readme_jupyter_lab_command_serves_the_notebook(tmp_path):
    port, token = free_port(), "tbmem-test-token"
    cmd = _readme_command("lab") + ["--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
                                    f"--IdentityProvider.token={token}", "--ServerApp.port_retries=0"]
    if os.geteuid() == 0:  # CI runs as root, where Jupyter asks for it (README says so)
        cmd.append("--allow-root")
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg")}
    log = tmp_path / "lab.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"

    def get(path: str) -> tuple[int, bytes]:
        sep = "&" if "?" in path else "?"
        try:
            with urllib.request.urlopen(f"{base}{path}{sep}token={token}", timeout=30) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    try:
        wait_served(proc, base, lambda _: get("/api/status")[0] == 200, log, what="jupyter lab")
        status, body = get("/api/contents/memory_analysis.ipynb")  # a file argument: its folder is the root
        assert status == 200
        doc = json.loads(body)
        assert doc["type"] == "notebook" and doc["content"]["cells"][0]["cell_type"] == "markdown"
        status, body = get("/lab")
        assert status == 200 and b"JupyterLab" in body
        status, body = get("/api/kernelspecs")
        assert status == 200 and "python3" in json.loads(body)["kernelspecs"]
    finally:
        stop(proc, timeout_s=30)
