"""scripts/move_internal_modules.py on a small made-up tbmem in a git repository of its own: the move, what it
rewrites and what it leaves, and the pass after a merge (``--references``) that moves a module added again at
an old path and rewrites the references the merged branches brought, idempotently."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "move_internal_modules.py"


@pytest.fixture(scope="module")
def move():
    spec = importlib.util.spec_from_file_location("move_internal_modules", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    yield mod
    del sys.modules[spec.name]


# A tbmem as it was in 0.1, in miniature: the facade tbmem.analysis, a package (census) with a C extension, a
# package whose name is also a key of the trainers' config (snapshot), the public console and integrations.
FILES = {
    "tbmem/__init__.py": '"""tbmem."""\nfrom tbmem._lazy import lazy_exports\n\n_EXPORTS = {\n'
                         '    "take_census": "tbmem.census",\n    "Thing": "tbmem.census.things",\n'
                         '    "SnapshotConfig": "tbmem.snapshot.config",\n}\n',
    "tbmem/py.typed": "",
    "tbmem/_lazy.py": "def lazy_exports(name, table):\n    return None, None\n",
    "tbmem/config.py": "class MemoryWriterConfig:\n    every: int = 10\n    snapshot: object = None\n",
    "tbmem/cli.py": '"""python -m tbmem.cli"""\n_SUBCOMMANDS = ("tbmem.snapshot.cli", "tbmem.analysis.cli")\n',
    "tbmem/census/__init__.py": "from tbmem.census.core import take_census\nfrom tbmem.census.things import Thing\n",
    "tbmem/census/core.py": "from tbmem import tags, config\nfrom tbmem._lazy import lazy_exports\n"
                            "def take_census():\n    return None\n# :class:`~tbmem.census.things.Thing`\n",
    "tbmem/census/things.py": "class Thing:\n    pass\n",
    "tbmem/census/big.py": "from tbmem.census.things import Thing\n" + "".join(
        f"def f{i}():\n    return {i}\n\n\n" for i in range(30)),
    "tbmem/census/_gcwalk.c": "/* the heap pass of tbmem/census/heap.py */\n",
    "tbmem/tags.py": "TAGS = {}\n",
    "tbmem/snapshot/__init__.py": "from tbmem.snapshot.config import SnapshotConfig\n",
    "tbmem/snapshot/config.py": 'SCHEMA = "tbmem.snapshot"\nclass SnapshotConfig:\n    every: int = 0\n',
    "tbmem/snapshot/cli.py": "def add_parser(sub):\n    return sub\n",
    "tbmem/snapshot/viewer.js": "// the viewer of tbmem/snapshot/viewer.py\n",
    "tbmem/analysis/__init__.py": '_EXPORTS = {"load_scalars": "tbmem.analysis.load", "compare": "tbmem.analysis.compare"}\n',
    "tbmem/analysis/load.py": "def load_scalars():\n    return None\n",
    "tbmem/analysis/compare.py": "def compare():\n    return None\n",
    "tbmem/analysis/cli.py": "from tbmem.analysis import load\nfrom tbmem.analysis.load import load_scalars\n",
    "tbmem/console/__init__.py": "from tbmem.census import take_census\n",
    "tbmem/integrations/lightning.py": "from tbmem import take_census\n",
    "pyproject.toml": '[project.scripts]\ntbmem = "tbmem.cli:main"\n\n[tool.setuptools.package-data]\n'
                      'tbmem = ["py.typed", "snapshot/*.js"]\n',
    "setup.py": 'Extension("tbmem.census._gcwalk", ["tbmem/census/_gcwalk.c"])\n',
    "Makefile": "demo:\n\tpython -m tbmem.cli report runs\n",
    "CHANGELOG.md": "- tbmem.census: a faster heap pass\n",
    "docs/usage.md": "```python\nfrom tbmem.snapshot import SnapshotConfig\nfrom tbmem.census.core import take_census\n```\n"
                     "`tbmem.snapshot.every=5` and `~tbmem.snapshot` in a trainer config.\n"
                     "The heap pass is tbmem/census/_gcwalk.c. `tbmem.analysis.compare(df)`; "
                     "`tbmem.analysis.load` is its loader.\nThe facade: tbmem/analysis/__init__.py.\n",
    "tests/test_x.py": 'from tbmem.census.things import Thing\nfrom tbmem import take_census, tags\n'
                       'OVERRIDES = ["tbmem.snapshot.every=3", "~tbmem.snapshot", "tbmem.every=2"]\n'
                       'SCHEMAS = {"tbmem.snapshot": 1}\nDOC = {"schema": "tbmem.snapshot"}\n'
                       'HERE = ROOT / "tbmem" / "census" / "core.py"\n'
                       'CMD = [sys.executable, "-m", "tbmem.cli", "report"]\n'
                       '# move_internal_modules: keep\nOLD = "tbmem.census"\n# move_internal_modules: end\n',
}


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def tree(tmp_path):
    for rel, text in FILES.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    # what a build and a run leave at the old paths: must not outlive the move (a namespace package, an old .so)
    (tmp_path / "tbmem/census/__pycache__").mkdir()
    (tmp_path / "tbmem/census/__pycache__/core.cpython-311.pyc").write_bytes(b"")
    (tmp_path / "tbmem/census/_gcwalk.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")
    return tmp_path


def test_the_move(move, tree):
    moves, changed, notes = move.run(tree)
    assert ("tbmem/census/core.py", "tbmem/_internal/census/core.py") in moves
    assert ("tbmem/snapshot/viewer.js", "tbmem/_internal/snapshot/viewer.js") in moves
    assert ("tbmem/analysis/load.py", "tbmem/_internal/analysis/load.py") in moves
    kept = {"tbmem/__init__.py", "tbmem/py.typed", "tbmem/analysis/__init__.py", "tbmem/console/__init__.py",
            "tbmem/integrations/lightning.py"}
    tracked = set(_git(tree, "ls-files", "tbmem").splitlines())
    assert kept <= tracked
    assert {t for t in tracked if not t.startswith("tbmem/_internal/")} == kept | {"tbmem/__main__.py"}
    assert not (tree / "tbmem" / "census").exists()  # caches and the old extension went with the folder
    assert "from tbmem._internal.cli import main" in (tree / "tbmem/__main__.py").read_text()
    # the packages it makes declare __all__ as every module must (tests/test_doctests.py)
    assert (tree / "tbmem/_internal/__init__.py").read_text().endswith("\n__all__: list[str] = []\n")
    assert (tree / "tbmem/_internal/analysis/__init__.py").read_text().endswith("\n__all__: list[str] = []\n")

    def text(rel: str) -> str:
        return (tree / rel).read_text()

    assert '"take_census": "tbmem._internal.census"' in text("tbmem/__init__.py")
    assert "from tbmem._internal._lazy import lazy_exports" in text("tbmem/__init__.py")
    assert text("tbmem/_internal/census/core.py").startswith("from tbmem._internal import tags, config\n")
    assert text("tbmem/_internal/census/core.py").endswith("# :class:`~tbmem.Thing`\n")  # a role: the public name
    assert text("tbmem/_internal/cli.py") == ('"""python -m tbmem"""\n_SUBCOMMANDS = ("tbmem._internal.snapshot.cli", '
                                              '"tbmem._internal.analysis.cli")\n')
    assert text("tbmem/_internal/analysis/cli.py") == ("from tbmem._internal.analysis import load\n"
                                                       "from tbmem._internal.analysis.load import load_scalars\n")
    assert text("tbmem/analysis/__init__.py") == ('_EXPORTS = {"load_scalars": "tbmem._internal.analysis.load", '
                                                  '"compare": "tbmem._internal.analysis.compare"}\n')
    assert text("tbmem/_internal/snapshot/config.py").startswith('SCHEMA = "tbmem.snapshot"\n')  # a format's name
    assert text("pyproject.toml") == ('[project.scripts]\ntbmem = "tbmem._internal.cli:main"\n\n'
                                      '[tool.setuptools.package-data]\ntbmem = ["py.typed", "_internal/snapshot/*.js"]\n')
    assert text("setup.py") == 'Extension("tbmem._internal.census._gcwalk", ["tbmem/_internal/census/_gcwalk.c"])\n'
    assert text("Makefile") == "demo:\n\tpython -m tbmem report runs\n"
    assert text("CHANGELOG.md") == FILES["CHANGELOG.md"]
    # what users read: the public names (from the public __init__s' tables), Hydra keys left alone
    assert text("docs/usage.md") == (
        "```python\nfrom tbmem import SnapshotConfig\nfrom tbmem import take_census\n```\n"
        "`tbmem.snapshot.every=5` and `~tbmem.snapshot` in a trainer config.\n"
        "The heap pass is tbmem/_internal/census/_gcwalk.c. `tbmem.analysis.compare(df)`; "
        "`tbmem._internal.analysis.load` is its loader.\nThe facade: tbmem/analysis/__init__.py.\n")
    assert text("tests/test_x.py") == (
        'from tbmem._internal.census.things import Thing\nfrom tbmem import take_census\n'
        'from tbmem._internal import tags\n'
        'OVERRIDES = ["tbmem.snapshot.every=3", "~tbmem.snapshot", "tbmem.every=2"]\n'
        'SCHEMAS = {"tbmem.snapshot": 1}\nDOC = {"schema": "tbmem.snapshot"}\n'
        'HERE = ROOT / "tbmem" / "_internal" / "census" / "core.py"\n'
        'CMD = [sys.executable, "-m", "tbmem", "report"]\n'
        '# move_internal_modules: keep\nOLD = "tbmem.census"\n# move_internal_modules: end\n')
    assert any('tests/test_x.py:5: left alone: tbmem.snapshot' in n for n in notes), notes
    assert "tests/test_x.py" in changed and "CHANGELOG.md" not in changed

    # a second pass finds nothing; --check says so with its exit status
    assert move.run(tree, references=True)[:2] == ([], [])
    assert move.main(["--root", str(tree), "--references", "--check"]) == 0


def test_references_after_a_merge(move, tree):
    """What a branch written against 0.1's paths brings: a new module at an old path, references to the old
    paths in code and docs. The first pass after the merge moves and rewrites them, the second finds nothing."""
    with pytest.raises(SystemExit, match="does not exist yet"):
        move.run(tree, references=True)
    move.run(tree)
    (tree / "tbmem/census").mkdir()
    (tree / "tbmem/census/extra.py").write_text("from tbmem.census.core import take_census\n")
    (tree / "tbmem/spikes.py").write_text("from tbmem.tags import TAGS\n")
    (tree / "docs/usage.md").write_text((tree / "docs/usage.md").read_text() + "See tbmem/census/extra.py and "
                                        "`tbmem.census.extra`; `python -m tbmem.cli report`.\n")
    _git(tree, "add", "-A")
    assert move.main(["--root", str(tree), "--references", "--check"]) == 1
    moves, changed, _ = move.run(tree, references=True)
    assert sorted(moves) == [("tbmem/census/extra.py", "tbmem/_internal/census/extra.py"),
                             ("tbmem/spikes.py", "tbmem/_internal/spikes.py")]
    assert (tree / "tbmem/_internal/census/extra.py").read_text() == "from tbmem._internal.census.core import take_census\n"
    assert (tree / "tbmem/_internal/spikes.py").read_text() == "from tbmem._internal.tags import TAGS\n"
    assert (tree / "docs/usage.md").read_text().endswith(
        "See tbmem/_internal/census/extra.py and `tbmem._internal.census.extra`; `python -m tbmem report`.\n")
    assert not (tree / "tbmem/census").exists()
    assert move.run(tree, references=True)[:2] == ([], [])

    # a module at both paths (the merge kept both): merged by hand, never overwritten
    (tree / "tbmem/tags.py").write_text("TAGS = {'new': 1}\n")
    _git(tree, "add", "tbmem/tags.py")
    with pytest.raises(SystemExit, match="tbmem/_internal/tags.py"):
        move.run(tree, references=True)
    assert (tree / "tbmem/_internal/tags.py").read_text() == "TAGS = {}\n"


def test_resolve_merge_takes_the_merged_side_where_the_move_was_mechanical(move, tree, monkeypatch):
    """The lead's merge: main moved on (an import line edited at the old path, a doc line), the move's branch
    was merged last. Its mechanical conflicts take main's side and the references pass redoes the rewrite;
    a file the branch edited by hand after the move is left to merge by hand."""
    for key in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{key}_NAME", "t")
        monkeypatch.setenv(f"GIT_{key}_EMAIL", "t@t")
    _git(tree, "commit", "-qm", "0.1")
    _git(tree, "branch", "-M", "main")
    _git(tree, "checkout", "-qb", "move")
    move.run(tree)
    _git(tree, "add", "-A")
    _git(tree, "commit", "-qm", move.MOVE_SUBJECT + " (the script)")
    (tree / "docs/usage.md").write_text("By hand after the move.\n")
    _git(tree, "commit", "-qam", "a hand edit")
    big = tree / "tbmem/_internal/census/big.py"  # a later pass of the script's: still only mechanical
    big.write_text(big.read_text().replace("def f29", "def f_29"))
    _git(tree, "commit", "-qam", "the references pass again (nothing by hand)")
    _git(tree, "checkout", "-q", "main")
    (tree / "tbmem/census/core.py").write_text(FILES["tbmem/census/core.py"].replace(
        "from tbmem import tags, config\n", "from tbmem import tags, config  # main's edit\n"))
    (tree / "tbmem/census/big.py").write_text(FILES["tbmem/census/big.py"].replace(
        "import Thing\n", "import Thing  # main's edit\n"))
    (tree / "docs/usage.md").write_text("Main's edit.\n")
    _git(tree, "commit", "-qam", "main moves on")
    merged = subprocess.run(["git", "merge", "-q", "move"], cwd=tree, capture_output=True, text=True, check=False)
    assert merged.returncode != 0
    # git saw this small, rewritten file as deleted by the move (a modify/delete conflict at the old path)
    # (a larger one as renamed: a content conflict at the new path)
    assert set(_git(tree, "diff", "--name-only", "--diff-filter=U").split()) == {
        "docs/usage.md", "tbmem/census/core.py", "tbmem/_internal/census/big.py"}
    taken, left = move.resolve_merge(tree)
    assert (taken, left) == (["tbmem/_internal/census/big.py", "tbmem/census/core.py -> tbmem/_internal/census/core.py"],
                             ["docs/usage.md"])
    assert not (tree / "tbmem/census/core.py").exists()
    _git(tree, "checkout", "--theirs", "--", "docs/usage.md")  # the hand merge
    _git(tree, "add", "docs/usage.md")
    move.run(tree, references=True)
    assert (tree / "tbmem/_internal/census/core.py").read_text().startswith(
        "from tbmem._internal import tags, config  # main's edit\nfrom tbmem._internal._lazy import lazy_exports\n")
    assert (tree / "tbmem/_internal/census/big.py").read_text().startswith(
        "from tbmem._internal.census.things import Thing  # main's edit\n")
    assert move.run(tree, references=True)[:2] == ([], [])
    with pytest.raises(SystemExit, match="no merge in progress"):
        _git(tree, "commit", "-qam", "merged")
        move.resolve_merge(tree)
