"""Every command the README and ``make demo`` print works exactly as printed, from the clone's root.

The clone's root is a folder of the test's that holds the repository's files (links to them) and
``.venv`` (the venv this test runs in, as ``make`` made it), where ``make demo`` itself is run (its
install taken as done: ``make -o``): its ``runs/`` are then the demo's, and what it prints at the end
is what a new user reads. Each command is run with ``bash -c`` as printed; one that finishes must exit
0 within its time limit. Servers (TensorBoard, JupyterLab) and trainings longer than a test are
started, must reach their first sign of work (TensorBoard: listening, with the Memory tab in its
plugin list; a training: its ``... trainer on cpu, logging to ...`` line), and are stopped.

The only change to a command: where 6006 would clash with another test, ``make tensorboard`` gets
its port through ``TB_PORT`` in the environment (the command line is as printed) and a
``.venv/bin/tensorboard`` command gets ``--port``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests._demo import ROOT
from tests._servers import free_port, serves_memory_tab, wait_served

pytestmark = pytest.mark.slow

#: Commands the test does not run: the installs and the test suite itself (this test runs inside it).
NOT_RUN = re.compile(r"^make (demo|install|test|test-all|gpu-test|bench)\b")
#: A command that may outlive the test: started, its first sign of work awaited, stopped.
LONG = [
    (re.compile(r"(^make tensorboard$|/tensorboard )"), "server"),
    (re.compile(r"/jupyter lab "), r"https?://127\.0\.0\.1:\d+/lab"),
    (re.compile(r"run\.py .*--config-name=(burgers_experiment|heat_physical_experiment)"), r"trainer on \w+"),
    (re.compile(r"/torchrun "), r"trainer on \w+"),
    (re.compile(r"/tbmem forecast "), r"batch size|batch_size|peak"),
]


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> tuple[Path, str]:
    """A clone's root after ``make demo``, and what ``make demo`` printed."""
    root = tmp_path_factory.mktemp("clone")
    for entry in ROOT.iterdir():
        if entry.name not in {"runs", ".cache", ".git", "view.html", "memory.png", "notebooks"}:
            (root / entry.name).symlink_to(entry)
    # the notebook finds runs/ from its own folder's parent: a copy here, or it would read the repository's
    (root / "notebooks").mkdir()
    for entry in (ROOT / "notebooks").iterdir():
        if entry.suffix == ".ipynb":
            (root / "notebooks" / entry.name).write_bytes(entry.read_bytes())
        else:
            (root / "notebooks" / entry.name).symlink_to(entry)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(["make", "-o", ".venv/.installed-demo", "demo"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return root, done.stdout


def demo_closing_commands(printed: str) -> list[str]:
    """The commands in the lines ``make demo`` prints after its two runs."""
    closing = printed.rsplit("Done in", 1)[1].split("\n", 1)[1]
    found = []
    for line in closing.splitlines():
        found += re.findall(r"(?:^|:\s+)(make [a-z-]+)", line)
        found += [c.strip() for c in re.findall(r"(\.venv/bin/[^;()]+)", line)]
    return found


def readme_commands() -> list[str]:
    """Every line of the README's bash blocks (comments dropped) and every inline command written
    for the clone's root (``.venv/bin/...`` or ``make ...``) outside them."""
    text = (ROOT / "README.md").read_text()
    found = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.DOTALL):
        for line in block.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                found.append(line)
    prose = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    for span in re.findall(r"`([^`\n]+)`", prose):
        if re.match(r"(\.venv/bin/\S+|make [a-z-]+)( |$)", span) and not re.search(r"[A-Z]{4,}|<", span):
            found.append(span)
    return list(dict.fromkeys(found))


def _run(command: str, root: Path, tmp: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    kind = next((k for pattern, k in LONG if pattern.search(command)), None)
    shell = command
    port = free_port()
    if kind == "server" and command.startswith("make"):
        env["TB_PORT"] = str(port)
    elif kind == "server":
        shell = f"{command} --port {port}"
    elif "/jupyter lab " in command and os.geteuid() == 0:
        shell = f"{command} --allow-root --no-browser"  # as the README says: as root, add --allow-root
    log = tmp / "out.txt"
    if kind is None:
        with log.open("w") as out:
            done = subprocess.run(["bash", "-c", shell], cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
                                  timeout=300, check=False)
        assert done.returncode == 0, f"{command!r} exited {done.returncode}:\n{log.read_text()[-3000:]}"
        return
    with log.open("w") as out:
        proc = subprocess.Popen(["bash", "-c", shell], cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        if kind == "server":
            # listening, with the Memory tab (the page of http://127.0.0.1:6006/#tbmem) in its plugin list
            wait_served(proc, f"http://127.0.0.1:{port}", serves_memory_tab, log, what="tensorboard")
            return
        deadline = time.monotonic() + 300
        while not re.search(kind, log.read_text()):
            if proc.poll() is not None:
                assert proc.returncode == 0, f"{command!r} exited {proc.returncode}:\n{log.read_text()[-3000:]}"
                return
            assert time.monotonic() < deadline, f"{command!r}: no sign of work in 300 s:\n{log.read_text()[-3000:]}"
            time.sleep(0.5)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def test_the_demo_prints_the_memory_tab_and_one_way_to_view_its_runs(clone):
    _, printed = clone
    closing = printed.rsplit("Done in", 1)[1]
    assert "http://127.0.0.1:6006/#tbmem" in closing
    # one command for both runs: the trainers' own "View the run with" lines are left out in the demo
    assert printed.count("tensorboard --logdir") == 1 and "View the run with" not in printed
    assert demo_closing_commands(printed) == ["make tensorboard", ".venv/bin/tensorboard --logdir runs --host 127.0.0.1",
                                              "make report", ".venv/bin/tbmem report runs"]


def test_every_command_the_demo_and_the_readme_print_works_as_printed(clone, tmp_path):
    root, printed = clone
    commands = demo_closing_commands(printed) + readme_commands()
    assert ".venv/bin/tbmem compare runs/burgers_quick_test/* runs/burgers_physical_quick_test/*" in commands
    ran = []
    for i, command in enumerate(dict.fromkeys(commands)):
        if NOT_RUN.match(command):
            continue
        where = tmp_path / str(i)
        where.mkdir()
        _run(command, root, where)
        ran.append(command)
    assert len(ran) >= 15, ran


def test_the_readme_says_how_its_commands_run():
    head = (ROOT / "README.md").read_text()[:1500]
    assert "from the clone's root" in head and "source .venv/bin/activate" in head
    for command in readme_commands():
        # a program of the venv is written with its path, or is a make target
        assert re.match(r"(\.venv/bin/|make )", command), command
