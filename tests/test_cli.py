import subprocess
import sys

from tbmem.cli import main
from tbmem.tags import TAGS


def test_tags_command_prints_the_table(capsys):
    assert main(["tags"]) == 0
    out = capsys.readouterr().out
    assert all(t.tag in out for t in TAGS.values())


def test_tags_grep(capsys):
    assert main(["tags", "--grep", "fragmentation"]) == 0
    rows = capsys.readouterr().out.strip().splitlines()[2:]
    assert rows and all("fragmentation" in r.lower() for r in rows)


def test_console_script_is_installed():
    out = subprocess.run([sys.executable, "-m", "tbmem.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "tags" in out.stdout
