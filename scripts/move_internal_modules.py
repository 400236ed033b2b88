#!/usr/bin/env python3
"""Issue 36, part C: move every module of tbmem outside the drawn public set into ``tbmem/_internal/``.

Run from the root of a clean checkout (after merging every branch):

    python scripts/move_internal_modules.py            # git mv + rewrite references, then prints what to do by hand
    python scripts/move_internal_modules.py --dry-run  # only print the moves and the files that would change

Public (they stay): ``tbmem/__init__.py``, ``tbmem/py.typed``, ``tbmem/console/``, ``tbmem/integrations/``
(and everything below it), and the facades ``tbmem/analysis/__init__.py`` and ``tbmem/forecast/__init__.py``
(their submodules move to ``tbmem/_internal/analysis/`` and ``tbmem/_internal/forecast/``). Everything else
under ``tbmem/`` moves to ``tbmem/_internal/<same relative path>`` (non-Python files of a moved package too:
the viewer's JS/CSS/HTML, the plugin's static files, the C sources).

References rewritten in every tracked text file (Python, Markdown, notebooks, Makefile, setup.py,
pyproject.toml, .ci/, conf/, scripts, benchmarks, tests):
  * dotted names ``tbmem.<moved>`` -> ``tbmem._internal.<moved>`` (for the facades only where the next part is
    one of their submodules: ``tbmem.analysis.load`` moves, ``tbmem.analysis.load_scalars`` does not);
  * paths ``tbmem/<moved>`` -> ``tbmem/_internal/<moved>``;
  * ``from tbmem import <module>[ as x]`` -> ``from tbmem._internal import <module>[ as x]``;
  * pyproject's package-data globs (relative to the tbmem package) get the ``_internal/`` prefix;
  * docs/architecture.md's ``tbmem/_*.py`` layer pattern becomes ``tbmem/_internal/_*.py``.
It then appends the architecture rule (every module outside the public set is under ``tbmem._internal``)
to tests/test_architecture.py. Re-runnable: a second run finds nothing left to move and changes nothing.

Not yet run on main (issue 36 is open for it): it was tried on a scratch copy of the API branch, where the
architecture, public-API and doctest tests gave 442 passed, 6 failed. What it leaves by hand: the made-up
graphs and tables of tests/test_architecture.py (it rewrites their strings like real names: restore them);
paths joined from parts (``ROOT / "tbmem" / "census"``: grep ``"tbmem" /`` and ``parents[`` in tests/ and
benchmarks/); ``python -m tbmem.cli`` in prose (prefer the ``tbmem`` command); names built at run time
(``f"tbmem.{name}"``); this script's own strings (it rewrites every tracked text file but CHANGELOG.md).
Then ``setup.py build_ext --inplace`` (the extensions' names change) and ``python -m tbmem._internal._apidoc``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path.cwd()
PKG = ROOT / "tbmem"
INTERNAL = "_internal"
KEEP_FILES = {"__init__.py", "py.typed"}
PUBLIC_PACKAGES = {"console", "integrations", INTERNAL}
FACADES = {"analysis", "forecast"}  # the package stays (its __init__), its submodules move
TEXT_SUFFIXES = {".py", ".md", ".ipynb", ".toml", ".cfg", ".txt", ".yaml", ".yml", ".ini", ".sh", ".js", ".html",
                 ".c", ".h", ".cpp", ""}
SKIP_DIRS = {".git", ".venv", "build", "node_modules", "vendor"}
SKIP_FILES = {"CHANGELOG.md"}  # history names the modules as they were

ARCH_TEST = '''

# --- issue 36: the public surface is drawn (added by api_rename.py) ----------------------------------------
PUBLIC_TOP = ("tbmem", "tbmem.console", "tbmem.analysis", "tbmem.forecast", "tbmem.integrations")


def test_every_module_outside_the_public_set_is_internal():
    """A module of tbmem is public (docs/api.md) or lives under tbmem._internal / has a leading underscore."""
    bad = []
    for mod in module_files():
        if not mod.startswith("tbmem"):
            continue
        parts = mod.split(".")
        if mod in PUBLIC_TOP or mod.startswith("tbmem.integrations.") or mod.startswith("tbmem.console."):
            continue
        if any(p.startswith("_") for p in parts[1:]):
            continue
        bad.append(mod)
    assert not bad, "modules outside the public set and not under tbmem._internal: " + ", ".join(bad)
'''


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout


def plan() -> list[tuple[str, str]]:
    """(old path, new path) of every tracked file that moves, relative to the root."""
    moves = []
    for rel in git("ls-files", "tbmem").splitlines():
        parts = rel.split("/")
        if len(parts) < 2 or parts[1] == INTERNAL:
            continue
        head = parts[1]
        if len(parts) == 2:
            if head in KEEP_FILES:
                continue
        elif head in PUBLIC_PACKAGES:
            continue
        elif head in FACADES and len(parts) == 3 and parts[2] == "__init__.py":
            continue
        moves.append((rel, "/".join(["tbmem", INTERNAL, *parts[1:]])))
    return moves


def moved_names(moves: list[tuple[str, str]]) -> tuple[set[str], dict[str, set[str]]]:
    """The first dotted part under tbmem that moves entirely (census, writer, _log, ...), and the facades'
    moved submodules (analysis -> {load, plot, ...})."""
    whole: set[str] = set()
    facade: dict[str, set[str]] = {f: set() for f in FACADES}
    for old, _ in moves:
        parts = old.split("/")
        name = Path(parts[1]).stem if len(parts) == 2 else parts[1]
        if name in FACADES:
            facade[name].add(Path(parts[2]).stem if len(parts) > 2 else "")
        else:
            whole.add(name)
    return whole, facade


def rewriter(whole: set[str], facade: dict[str, set[str]]):
    names = "|".join(sorted((re.escape(n) for n in whole), key=len, reverse=True))
    dotted = re.compile(rf"(?<![\w.])tbmem\.({names})(?![\w])")
    slashed = re.compile(rf"(?<![\w/.])tbmem/({names})(?=[/.\s`'\")\]:,*]|$)", re.M)
    from_import = re.compile(rf"^(\s*)from tbmem import ({names})\b", re.M)
    facade_rx = []
    for pkg, subs in facade.items():
        subs = {s for s in subs if s}
        if subs:
            alt = "|".join(sorted(map(re.escape, subs), key=len, reverse=True))
            facade_rx.append((re.compile(rf"(?<![\w.])tbmem\.{pkg}\.({alt})(?![\w])"), rf"tbmem.{INTERNAL}.{pkg}.\1"))
            facade_rx.append((re.compile(rf"(?<![\w/.])tbmem/{pkg}/({alt})(?=[/.\s`'\")\]:,*]|$)", re.M),
                              rf"tbmem/{INTERNAL}/{pkg}/\1"))
            facade_rx.append((re.compile(rf"^(\s*)from tbmem\.{pkg} import ({alt})\b", re.M),
                              rf"\1from tbmem.{INTERNAL}.{pkg} import \2"))

    def rewrite(text: str) -> str:
        text = dotted.sub(rf"tbmem.{INTERNAL}.\1", text)
        text = slashed.sub(rf"tbmem/{INTERNAL}/\1", text)
        text = from_import.sub(rf"\1from tbmem.{INTERNAL} import \2", text)
        for rx, repl in facade_rx:
            text = rx.sub(repl, text)
        return text

    return rewrite


def pyproject_data(text: str) -> str:
    """package-data globs of the tbmem package: the moved folders are below _internal/ now."""
    def fix(m: re.Match[str]) -> str:
        def one(lit: re.Match[str]) -> str:
            path = lit.group(1)
            return lit.group(0) if path == "py.typed" or path.startswith(INTERNAL + "/") else f'"{INTERNAL}/{path}"'
        body = re.sub(r'"([^"]*)"', one, m.group(2))
        return m.group(1) + body
    return re.sub(r'(\[tool\.setuptools\.package-data\]\s*\ntbmem = )(\[[^\]]*\])', fix, text)


def text_files() -> list[Path]:
    out = []
    for rel in git("ls-files").splitlines():
        p = ROOT / rel
        if any(part in SKIP_DIRS for part in Path(rel).parts) or not p.is_file() or p.name in SKIP_FILES:
            continue
        if p.suffix in TEXT_SUFFIXES or p.name in ("Makefile",):
            out.append(p)
    return out


def main() -> int:  # noqa: C901 - a one-off migration, read top to bottom
    dry = "--dry-run" in sys.argv
    if not (PKG / "__init__.py").exists():
        print("run from the root of a tbmem checkout", file=sys.stderr)
        return 2
    moves = plan()
    print(f"{len(moves)} files to move")
    if not moves:
        print("nothing left to move")
    whole, facade = moved_names(moves)
    if not dry:
        for old, new in moves:
            (ROOT / new).parent.mkdir(parents=True, exist_ok=True)
            git("mv", old, new)
        # a folder left empty would import as a namespace package: a stale ``import tbmem.census`` must fail
        for folder in sorted((p for p in PKG.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            if INTERNAL not in folder.parts and not any(folder.iterdir()):
                folder.rmdir()
        for pkg in FACADES:
            init = PKG / INTERNAL / pkg / "__init__.py"
            if (PKG / INTERNAL / pkg).is_dir() and not init.exists():
                init.write_text(f'"""The implementation of the public facade :mod:`tbmem.{pkg}`."""\n\n'
                                '__all__: list[str] = []\n')
                git("add", str(init.relative_to(ROOT)))
        init = PKG / INTERNAL / "__init__.py"
        if not init.exists():
            init.write_text('"""tbmem\'s own modules: not part of the public API (docs/api.md), may change '
                            'without notice."""\n\n__all__: list[str] = []\n')
            git("add", str(init.relative_to(ROOT)))
    if whole or any(facade.values()):
        rewrite = rewriter(whole, facade)
        changed = []
        for path in text_files():
            try:
                text = path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, FileNotFoundError):
                continue
            new = rewrite(text)
            if path.name == "pyproject.toml":
                new = pyproject_data(new)
            if path.as_posix().endswith("docs/architecture.md"):
                # the layer table's globs of private modules, and the facades' submodules beside them
                new = re.sub(rf"`tbmem/(?!{INTERNAL}/|__init__\.py)(_[^`]*)`", rf"`tbmem/{INTERNAL}/\1`", new)
                for pkg in FACADES:
                    new = new.replace(f"`tbmem/{pkg}/`,", f"`tbmem/{pkg}/`, `tbmem/{INTERNAL}/{pkg}/`,")
                    new = new.replace(f"`tbmem/{pkg}/` |", f"`tbmem/{pkg}/`, `tbmem/{INTERNAL}/{pkg}/` |")
            if new != text:
                changed.append(path.relative_to(ROOT).as_posix())
                if not dry:
                    path.write_text(new, encoding="utf-8")
        print(f"{len(changed)} files rewritten" + (" (dry run)" if dry else ""))
        if dry:
            print("\n".join("  " + c for c in changed))
    arch = ROOT / "tests" / "test_architecture.py"
    if not dry and arch.exists() and "test_every_module_outside_the_public_set_is_internal" not in arch.read_text():
        arch.write_text(arch.read_text() + ARCH_TEST)
    if not dry:
        print("now: python setup.py build_ext --inplace; python -m tbmem._apidoc; then the tests "
              "(the hand edits: this script's docstring)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
