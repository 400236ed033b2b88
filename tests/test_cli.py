import subprocess
import sys

from tbmem._internal.cli import main
from tbmem._internal.tags import TAGS


def test_tags_command_prints_the_table(capsys):
    assert main(["tags"]) == 0
    out = capsys.readouterr().out
    assert all(t.tag in out for t in TAGS.values())


def test_tags_grep(capsys):
    assert main(["tags", "--grep", "fragmentation"]) == 0
    rows = capsys.readouterr().out.strip().splitlines()[2:]
    assert rows and all("fragmentation" in r.lower() for r in rows)


def test_console_script_is_installed():
    out = subprocess.run([sys.executable, "-m", "tbmem", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "tags" in out.stdout


# --- a reader that goes away early (`tbmem tags | head -5`) -------------------------------------------

import os  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from tbmem._internal.cli import EXIT_BROKEN_PIPE, plain_text  # noqa: E402



def _with_closed_stdout(*argv: str) -> tuple[int, str]:
    """Run ``tbmem ARGV`` with its stdout a pipe whose reader is gone before the first write."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                       os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-m", "tbmem", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    proc.stdout.close()  # the reader is gone: every write the child makes fails with EPIPE
    with proc:
        try:
            err = proc.stderr.read().decode()
            return proc.wait(timeout=120), err
        finally:
            proc.kill()


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    from tbmem import MemoryWriter

    root = tmp_path_factory.mktemp("runs")
    for run in ("a", "b"):
        with MemoryWriter(root / run, every=1, census_every=0, custom_layout=False) as writer:
            for step in range(5):
                writer.add_scalar("Loss/train", 1.0 / (step + 1), step)
                writer.log_memory(step)
    return root


@pytest.mark.parametrize("argv", [("tags",), ("report", "{logdir}"), ("report", "{logdir}", "--json")])
def test_closed_stdout_ends_quietly_with_141(argv, logdir):
    status, err = _with_closed_stdout(*(a.format(logdir=logdir) for a in argv))
    assert status == EXIT_BROKEN_PIPE, err
    assert err == ""  # no traceback, no "Broken pipe"


def test_closed_stdout_of_snapshot_stats_ends_quietly():
    from tests._shared import require_shared

    real = require_shared() / "magma27_memory_snapshot.pickle"
    status, err = _with_closed_stdout("snapshot", "stats", str(real))
    assert status == EXIT_BROKEN_PIPE, err
    assert err == ""


def test_head_reads_the_first_line_of_a_long_output(logdir):
    """The shell case: `tbmem tags | head -1` prints one line and nothing on stderr."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                       os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run(["bash", "-c", f'"{sys.executable}" -m tbmem tags | head -1'],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout == "| tag | unit | meaning | when |\n"
    assert out.stderr == ""


def test_help_has_no_markup():
    parser_help = subprocess.run([sys.executable, "-m", "tbmem", "--help"], capture_output=True, text=True)
    assert parser_help.returncode == 0
    assert "``" not in parser_help.stdout and ":class:" not in parser_help.stdout
    assert "examples:" in parser_help.stdout
    for command in ("snapshot", "report", "forecast", "tags"):
        sub = subprocess.run([sys.executable, "-m", "tbmem", command, "--help"], capture_output=True, text=True)
        assert sub.returncode == 0, sub.stderr
        assert "``" not in sub.stdout and ":func:" not in sub.stdout, sub.stdout


def test_plain_text_strips_roles_and_literals():
    assert plain_text("``a`` and :class:`~tbmem.MemoryWriter`") == "a and tbmem.MemoryWriter"
