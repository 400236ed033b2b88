#!/usr/bin/env python3
"""Issue 36: every module of tbmem outside the drawn public set lives in ``tbmem/_internal/``.

Run from the root of a checkout whose changes are committed (it uses ``git mv``):

    python scripts/move_internal_modules.py               # the move: git mv + rewrite every reference
    python scripts/move_internal_modules.py --references  # after merging branches into a moved tree: move what
                                                          # appeared again at an old path, rewrite what is left
    ... --dry-run    print what would move and which files would change, change nothing
    ... --check      change nothing; exit 1 when something would move or change (tests, CI)
    ... --diff       with --dry-run or --check: the rewrites as a diff
    python scripts/move_internal_modules.py --resolve-merge  # during `git merge` of the move's branch, before
        --references: each conflicted file the branch changed only by its move commit takes the merged tree's
        side (the --references pass redoes the rewrite on it); the files it lists are merged by hand

Both modes are one idempotent pass (a second run finds nothing to do); ``--references`` also refuses a tree
where the move has not happened, so that it cannot be run on the wrong branch by mistake.

Public (they stay): ``tbmem/__init__.py``, ``tbmem/__main__.py``, ``tbmem/py.typed``, ``tbmem/console/`` and
``tbmem/integrations/`` (and everything below them), and the facades ``tbmem/analysis/__init__.py`` and
``tbmem/forecast/__init__.py`` (their submodules live in ``tbmem/_internal/analysis/`` and
``tbmem/_internal/forecast/``). Every other tracked file under ``tbmem/`` moves to ``tbmem/_internal/<same
relative path>``, non-Python files of a moved package too (the viewer's JS/CSS/HTML, the plugin's static files,
the C sources). A folder left with only caches and build outputs (``__pycache__``, the old ``.so`` files) is
deleted, so a stale ``import tbmem.census`` fails instead of finding a namespace package or an old extension.

The references, in every tracked text file but CHANGELOG.md, docs/api.md (generated), this script and its test.
A reference is rewritten when it names a module that now lives in ``tbmem/_internal/`` (the modules are read
from that folder, so the same pass works before and after a merge):

* dotted names: ``tbmem.census.core`` -> ``tbmem._internal.census.core``, ``tbmem.analysis.load`` ->
  ``tbmem._internal.analysis.load`` (a facade's submodule), ``tbmem.analysis.load_scalars`` unchanged (a public
  name); ``from tbmem import tags`` -> ``from tbmem._internal import tags``;
* paths: ``tbmem/census/core.py`` -> ``tbmem/_internal/census/core.py``, ``"tbmem" / "census"`` ->
  ``"tbmem" / "_internal" / "census"``, pyproject's package-data globs, docs/architecture.md's ``tbmem/_*.py``;
* ``python -m tbmem.cli`` -> ``python -m tbmem`` (``tbmem/__main__.py``), in prose and in argument lists;
* in what users read (README.md, docs/, notebooks/, examples/) and in Sphinx roles (``:func:`...```), a name
  the public API exports is written as the public name: ``from tbmem.snapshot import SnapshotConfig`` ->
  ``from tbmem import SnapshotConfig``, ``tbmem.snapshot.load_snapshot`` -> ``tbmem.load_snapshot``.

Left alone: a name that is also a key of the trainers' Hydra config (``tbmem.snapshot.every=500``,
``~tbmem.snapshot``, ``"tbmem.spikes": SpikeConfig``, ``tbmem.profile`` in YAML, the trainers and prose), the
snapshot document's schema name ``"tbmem.snapshot"``, names inside a ``move_internal_modules: keep`` ...
``move_internal_modules: end`` region, and names built at run time (``f"tbmem.{name}"``). What may need a
look is printed as ``left alone:`` lines. Then: ``python setup.py build_ext --inplace`` (the extensions'
names change), ``python -m tbmem._internal._apidoc``, and the tests (tests/test_architecture.py and
tests/test_public_api.py say what is still wrong).
"""

from __future__ import annotations

import argparse
import ast
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

INTERNAL = "_internal"
PUBLIC_FILES = {"__init__.py", "__main__.py", "py.typed"}
PUBLIC_PACKAGES = {"console", "integrations"}
FACADES = {"analysis", "forecast"}  # the package stays (its __init__), its submodules move
PUBLIC_INITS = ("tbmem/__init__.py", "tbmem/console/__init__.py", "tbmem/analysis/__init__.py",
                "tbmem/forecast/__init__.py")
TEXT_SUFFIXES = {".py", ".md", ".ipynb", ".toml", ".cfg", ".txt", ".yaml", ".yml", ".ini", ".sh", ".js", ".html",
                 ".c", ".h", ".cpp", ".in", ".json", ""}
SKIP_DIRS = {".git", ".venv", "build", "node_modules", "vendor"}
#: history names the modules as they were; api.md is generated; this script and its test hold old names as data
SKIP_FILES = {"CHANGELOG.md", "docs/api.md", "scripts/move_internal_modules.py",
              "tests/scripts/test_move_internal_modules.py"}
USER_DOCS = re.compile(r"^(README\.md|docs/(?!architecture\.md).*\.md|notebooks/.*|examples/.*)$")
CACHE_ONLY = re.compile(r"(__pycache__|\.pyc|\.so|\.pyd|\.o)$")
CODE_SUFFIXES = (".py", ".pyi", ".c", ".h", ".cpp")
KEEP_START, KEEP_END = "move_internal_modules: keep", "move_internal_modules: end"
#: text that looks like a module name and is not one (group 2, after the context of group 1): the snapshot
#: document's schema name, the folder of a run's artifacts in MLflow (tbmem/snapshot/)
PROTECTED = [re.compile(r"""(schema["']?\]?\s*[:=]{1,2}\s*b?["'])(tbmem\.snapshot)(?=["'])""", re.I),
             re.compile(r"""(SCHEMA\s*=\s*["'])(tbmem\.snapshot)(?=["'])"""),
             re.compile(r"(not a )(tbmem\.snapshot)\b"),
             re.compile(r"(artifacts under `)(tbmem/\w+/)")]
DOTTED = re.compile(r"(?<![\w.+/-])(?<![^`]~)tbmem((?:\.\w+)+)")  # ~: Hydra's delete, but :class:`~tbmem.x`
SLASHED = re.compile(r"(?<![\w/.~-])tbmem((?:/[\w.*-]+)+/?)")
JOINED = re.compile(r"""(?<!"plugins" / )(["'])tbmem\1(\s*/\s*)(["'])(\w+(?:\.py)?)\3""")
FROM_IMPORT = re.compile(r"""^(?P<lead>[ \t]*"?(?:>>> |\.\.\. |[-*] )?`*)from (?P<mod>tbmem(?:\.\w+)*) import """
                         r"""(?P<names>[\w ,]+?)(?P<tail>[ \t]*(?:#[^\n]*|`*(?:\\n)?"?,?))$""", re.M)
DASH_M = re.compile(r"""(-m["']?,?\s*["']?)tbmem\.cli\b(?!\.)""")
MAIN = '''"""``python -m tbmem``: the ``tbmem`` command, where its console script is not on PATH."""

import sys

from tbmem._internal.cli import main

if __name__ == "__main__":
    sys.exit(main())
'''
ROLE = re.compile(r":(?:func|class|mod|meth|attr|data|obj|exc):`~?$")


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout


def new_path(rel: str) -> str | None:
    """Where a file of tbmem/ belongs: ``tbmem/_internal/<same relative path>``, or None (public, or there)."""
    parts = rel.split("/")
    if parts[0] != "tbmem" or len(parts) < 2 or parts[1] == INTERNAL:
        return None
    head = parts[1]
    if (len(parts) == 2 and head in PUBLIC_FILES) or (len(parts) > 2 and head in PUBLIC_PACKAGES) or (
            head in FACADES and len(parts) == 3 and parts[2] == "__init__.py"):
        return None
    return "/".join(["tbmem", INTERNAL, *parts[1:]])


def plan(root: Path) -> list[tuple[str, str]]:
    """(old path, new path) of every tracked file under tbmem/ outside the public set and not yet internal."""
    moves = []
    for rel in dict.fromkeys(git(root, "ls-files", "tbmem").splitlines()):  # unmerged paths: once per stage
        new = new_path(rel)
        if new is not None:
            moves.append((rel, new))
    return moves


def _names_of(path: Path) -> set[str]:
    """Names a module defines or imports at its top, its ``__all__`` and the keys of a lazy ``_EXPORTS``."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, OSError):
        return set()
    names: set[str] = set()
    for node in tree.body:
        nodes = [node]
        if isinstance(node, ast.If | ast.Try):  # `if TYPE_CHECKING:` imports, try/except ImportError
            nodes += [n for n in ast.walk(node) if isinstance(n, ast.stmt)]
        for n in nodes:
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(n.name)
            elif isinstance(n, ast.Import | ast.ImportFrom):
                names.update((a.asname or a.name).split(".")[0] for a in n.names)
            elif isinstance(n, ast.Assign | ast.AnnAssign):
                targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                for t in targets:
                    names.update(e.id for e in ast.walk(t) if isinstance(e, ast.Name))
                if isinstance(n.value, ast.List | ast.Tuple | ast.Dict):
                    items = n.value.keys if isinstance(n.value, ast.Dict) else n.value.elts
                    names.update(e.value for e in items if isinstance(e, ast.Constant) and isinstance(e.value, str))
    return names


def _exports_table(path: Path) -> dict[str, str]:
    """A public ``__init__``'s lazy table (name -> "module" or "module:attr"), and its ``from X import`` names."""
    out: dict[str, str] = {}
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, OSError):
        return out
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Dict):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            if isinstance(target, ast.Name) and target.id == "_EXPORTS":
                for k, v in zip(node.value.keys, node.value.values):
                    if isinstance(k, ast.Constant) and isinstance(v, ast.Constant):
                        out[str(k.value)] = str(v.value)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                out.setdefault(a.asname or a.name, f"{node.module}:{a.name}")
    return out


def _old(dotted: str) -> str:
    """A module's name before the move (``tbmem._internal.census`` -> ``tbmem.census``)."""
    return dotted.replace(f"tbmem.{INTERNAL}.", "tbmem.", 1) if dotted.startswith(f"tbmem.{INTERNAL}.") else dotted


@dataclass
class Index:
    """What lives in tbmem/_internal/, by the names it had before the move."""

    modules: dict[str, Path] = field(default_factory=dict)  # old dotted name -> file
    packages: set[str] = field(default_factory=set)
    top: set[str] = field(default_factory=set)  # first path parts under tbmem/ that moved (census, writer.py, ...)
    facade_subs: dict[str, set[str]] = field(default_factory=dict)  # analysis -> {load, load.py, ...}
    public: dict[tuple[str, str], str] = field(default_factory=dict)  # (old module, name) -> public dotted name
    config_keys: set[str] = field(default_factory=set)  # moved names that are also keys of MemoryWriterConfig
    public_names: set[str] = field(default_factory=set)  # every public dotted name (tbmem.analysis.compare)
    _names: dict[str, set[str]] = field(default_factory=dict)

    def names(self, module: str) -> set[str]:
        if module not in self._names:
            self._names[module] = _names_of(self.modules[module]) if module in self.modules else set()
        return self._names[module]


def build_index(root: Path) -> Index:
    idx = Index(facade_subs={f: set() for f in FACADES})
    base = root / "tbmem" / INTERNAL
    public_paths = {"tbmem." + f for f in FACADES}
    for path in sorted(base.rglob("*")) if base.is_dir() else []:
        if "__pycache__" in path.parts or not path.is_file():
            continue
        rel = path.relative_to(base).parts
        if rel[0] in FACADES and len(rel) > 1:
            if rel[1] != "__init__.py":  # the implementation package's own: the facade's path is public
                idx.facade_subs[rel[0]].update({rel[1], rel[1].split(".")[0]})
        elif len(rel) > 1 or rel[0] not in PUBLIC_FILES:
            idx.top.update({rel[0], rel[0].split(".")[0] if rel[0].endswith(CODE_SUFFIXES) else rel[0]})
        if path.suffix not in (".py", ".c"):
            continue
        parts = list(path.relative_to(base).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts.pop()
        if not parts:
            continue
        name = ".".join(["tbmem", *parts])
        if name in public_paths:  # the facade's implementation package: the public module keeps the name
            continue
        idx.modules[name] = path
        if is_pkg:
            idx.packages.add(name)
    idx.top.discard("")
    cfg = next((p for p in (base / "config.py", root / "tbmem" / "config.py") if p.exists()), None)
    if cfg is not None:
        fields = set()
        for node in ast.walk(ast.parse(cfg.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.name == "MemoryWriterConfig":
                fields = {s.target.id for s in node.body if isinstance(s, ast.AnnAssign)
                          and isinstance(s.target, ast.Name)}
        idx.config_keys = {f for f in fields if f"tbmem.{f}" in idx.modules}
    _public_names(root, idx)
    return idx


def _public_names(root: Path, idx: Index) -> None:
    """(module, name) -> the public name, for every name a public module exports, and every moved module
    that re-exports it (``tbmem.snapshot.load_snapshot`` is ``tbmem.load_snapshot``)."""
    top = _exports_table(root / "tbmem" / "__init__.py")
    for init in PUBLIC_INITS:
        package = init.rpartition("/")[0].replace("/", ".")
        for name, target in _exports_table(root / init).items():
            if name.startswith("_"):
                continue
            module, _, attr = target.partition(":")
            public = f"{package}.{name}"
            if package != "tbmem" and top.get(name, "").partition(":")[0] == package:
                public = f"tbmem.{name}"  # tbmem.console.MemoryMonitor is tbmem.MemoryMonitor too
            idx.public.setdefault((_old(module), attr or name), public)
            idx.public_names.add(f"{package}.{name}")
    for _ in range(3):  # re-exports of re-exports
        for module, path in idx.modules.items():
            if path.suffix != ".py":
                continue
            for name, target in _exports_table(path).items():
                src, _, attr = target.partition(":")
                hit = idx.public.get((_old(src), attr or name))
                if hit is not None:  # a re-export of a public name
                    idx.public.setdefault((module, name), hit)
                hit = idx.public.get((module, name))
                if hit is not None:  # a public name's definition, where the module re-exporting it got it
                    idx.public.setdefault((_old(src), attr or name), hit)


@dataclass
class Rewriter:
    idx: Index
    notes: list[str] = field(default_factory=list)

    def module_of(self, parts: list[str]) -> tuple[str | None, int]:
        """The longest moved module ``tbmem.<parts[:k]>`` (None if there is none), and k."""
        for k in range(len(parts), 0, -1):
            name = "tbmem." + ".".join(parts[:k])
            if name in self.idx.modules:
                return name, k
        return None, 0

    def dotted(self, text: str, rel: str, user: bool) -> str:
        def sub(m: re.Match[str]) -> str:
            parts = m.group(1)[1:].split(".")
            module, k = self.module_of(parts)
            if module is None or parts[0] == INTERNAL:
                return m.group(0)
            rest = parts[k:]
            before, after = text[max(0, m.start() - 12):m.start()], text[m.end():m.end() + 3]
            literal = rel.endswith(".py") and before[-1:] in ("'", '"') and after[:1] in (before[-1:], ":")
            if "tbmem." + ".".join(parts[:2]) in self.idx.public_names and not literal:
                return m.group(0)  # tbmem.analysis.compare: the facade's public name, not its old submodule
            if rest and rest[0] not in self.idx.names(module) and k == 1 and parts[0] in self.idx.config_keys:
                return m.group(0)  # tbmem.snapshot.every: a Hydra key, not an attribute of the module
            if k == 1 and parts[0] in self.idx.config_keys and not rest and self._config_key(rel, before, after):
                self.notes.append(f"{rel}:{text.count(chr(10), 0, m.start()) + 1}: left alone: {m.group(0)} "
                                  "(a trainer config key here, or the module: check)")
                return m.group(0)
            line = text[text.rfind("\n", 0, m.start()) + 1:m.start()]
            if rest and (user or (ROLE.search(before) and ">>> " not in line)):  # a doctest's output: as is
                public = self.idx.public.get((module, rest[0]))
                if public is not None:
                    return public + "".join("." + p for p in rest[1:])
            return f"tbmem.{INTERNAL}." + ".".join(parts)

        return DOTTED.sub(sub, text)

    @staticmethod
    def _config_key(rel: str, before: str, after: str) -> bool:
        """Whether a bare ``tbmem.<config key>`` reads as the trainers' Hydra key rather than the module."""
        if re.search(r"(from |import |:mod:`~?)$", before):
            return False  # an import, a module's role: the module
        if re.match(r"""\s*=|["']?:\s""", after):
            return True  # tbmem.profile={...}, "tbmem.spikes": SpikeConfig, tbmem.sinks: [wandb]
        if not rel.endswith(".py") or rel.startswith(("trainers/", "conf/")):
            return True  # prose, YAML and the trainers name the config key
        return before.endswith("``")  # ``tbmem.profile`` in a docstring: either

    def slashed(self, text: str) -> str:
        def sub(m: re.Match[str]) -> str:
            parts = m.group(1).strip("/").split("/")
            if parts[0] in self.idx.top or (parts[0] in FACADES and len(parts) > 1
                                            and parts[1] in self.idx.facade_subs.get(parts[0], ())):
                return f"tbmem/{INTERNAL}" + m.group(1)
            return m.group(0)

        text = SLASHED.sub(sub, text)

        def joined(m: re.Match[str]) -> str:
            q, sep, q2, name = m.groups()
            if name in self.idx.top:
                return f"{q}tbmem{q}{sep}{q2}{INTERNAL}{q2}{sep}{q2}{name}{q2}"
            return m.group(0)

        return JOINED.sub(joined, text)

    def from_imports(self, text: str, rel: str, user: bool) -> str:
        def sub(m: re.Match[str]) -> str:
            mod = m.group("mod")
            names = [n.strip() for n in m.group("names").split(",") if n.strip()]
            bare = [n.split(" as ")[0].strip() for n in names]
            old = _old(mod)
            if user and old in self.idx.modules and all((old, b) in self.idx.public for b in bare):
                homes = {self.idx.public[(old, b)].rpartition(".")[0] for b in bare}
                renamed = [self.idx.public[(old, b)].rpartition(".")[2] for b in bare]
                if len(homes) == 1 and renamed == bare:
                    return f"{m.group('lead')}from {homes.pop()} import {m.group('names')}{m.group('tail')}"
            if mod == "tbmem" or (mod.count(".") == 1 and mod.split(".")[1] in FACADES):
                inner = "tbmem" if mod == "tbmem" else f"{mod}"
                moved = [f"{inner}.{b}" in self.idx.modules and f"{inner}.{b}" not in self.idx.public_names
                         for b in bare]
                if all(moved):
                    target = f"tbmem.{INTERNAL}" + ("" if mod == "tbmem" else "." + mod.split(".")[1])
                    return f"{m.group('lead')}from {target} import {m.group('names')}{m.group('tail')}"
                if any(moved) and re.fullmatch(r"[ \t]*(>>> )?", m.group("lead")):  # split in two imports
                    target = f"tbmem.{INTERNAL}" + ("" if mod == "tbmem" else "." + mod.split(".")[1])
                    mods = ", ".join(n for n, is_mod in zip(names, moved) if is_mod)
                    rest = ", ".join(n for n, is_mod in zip(names, moved) if not is_mod)
                    return (f"{m.group('lead')}from {mod} import {rest}{m.group('tail')}\n"
                            f"{m.group('lead')}from {target} import {mods}")
                if any(moved):
                    self.notes.append(f"{rel}:{text.count(chr(10), 0, m.start()) + 1}: left alone: "
                                      f"{m.group(0).strip()} (modules and names mixed: split it)")
            return m.group(0)

        return FROM_IMPORT.sub(sub, text)

    def rewrite(self, text: str, rel: str) -> str:
        user = bool(USER_DOCS.match(rel))
        held: list[str] = []

        def hold(kept: str) -> str:
            held.append(kept)
            return f"\0{len(held) - 1}\0"

        text = re.sub(rf"[^\n]*{re.escape(KEEP_START)}.*?{re.escape(KEEP_END)}[^\n]*", lambda m: hold(m.group(0)),
                      text, flags=re.S)
        for rx in PROTECTED:
            text = rx.sub(lambda m: m.group(1) + hold(m.group(2)), text)
        text = DASH_M.sub(r"\1tbmem", text)
        text = self.from_imports(text, rel, user)
        text = self.dotted(text, rel, user)
        text = self.slashed(text)
        if rel == "pyproject.toml":
            text = pyproject_data(text)
        if rel == "docs/architecture.md":
            text = re.sub(rf"`tbmem/(?!{INTERNAL}/|__init__\.py|__main__\.py)(_[^`]*)`", rf"`tbmem/{INTERNAL}/\1`", text)
        return re.sub(r"\0(\d+)\0", lambda m: held[int(m.group(1))], text)


def pyproject_data(text: str) -> str:
    """package-data globs of the tbmem package: the moved folders are below _internal/ now."""
    def fix(m: re.Match[str]) -> str:
        def one(lit: re.Match[str]) -> str:
            path = lit.group(1)
            head = path.split("/")[0]
            keep = path in PUBLIC_FILES or head in (INTERNAL, *PUBLIC_PACKAGES) or "/" not in path and "*" in path
            return lit.group(0) if keep else f'"{INTERNAL}/{path}"'
        return m.group(1) + re.sub(r'"([^"]*)"', one, m.group(2))
    return re.sub(r'(\[tool\.setuptools\.package-data\][^\[]*?\ntbmem = )(\[[^\]]*\])', fix, text, flags=re.S)


def text_files(root: Path) -> list[str]:
    out = []
    for rel in git(root, "ls-files").splitlines():
        p = root / rel
        if any(part in SKIP_DIRS for part in Path(rel).parts) or rel in SKIP_FILES or not p.is_file():
            continue
        if p.suffix in TEXT_SUFFIXES or p.name == "Makefile":
            out.append(rel)
    return out


def remove_stale_folders(root: Path, dry: bool) -> list[str]:
    """Old folders with nothing tracked left: deleted where they hold only caches and build outputs."""
    pkg, notes = root / "tbmem", []
    tracked = set(git(root, "ls-files", "tbmem").splitlines())
    for folder in sorted((p for p in pkg.iterdir() if p.is_dir()), key=str):
        if folder.name in (INTERNAL, *PUBLIC_PACKAGES, "__pycache__"):
            continue
        rel = folder.relative_to(root).as_posix() + "/"
        if folder.name in FACADES:  # the facade stays; its old submodules' caches and outputs go
            for p in folder.iterdir():
                if p.is_file() and p.name != "__init__.py" and CACHE_ONLY.search(p.name) and not dry:
                    p.unlink()
            continue
        if any(t.startswith(rel) for t in tracked):
            continue
        left = [p for p in folder.rglob("*") if p.is_file() and not CACHE_ONLY.search(p.name)
                and "__pycache__" not in p.parts]
        if left:
            notes.append(f"{rel}: untracked files at an old path, not moved (git add them and run again): "
                         + ", ".join(p.relative_to(root).as_posix() for p in left[:5]))
        elif not dry:
            shutil.rmtree(folder)
    for so in pkg.glob("*.so"):  # a top-level extension built before it moved
        if not dry:
            so.unlink()
    return notes


def run(root: Path, *, references: bool = False, dry: bool = False, diff: bool = False
        ) -> tuple[list[tuple[str, str]], list[str], list[str]]:
    """The pass: (moves, files rewritten, notes). ``dry``: compute only; ``diff``: print what would change."""
    if not (root / "tbmem" / "__init__.py").exists():
        raise SystemExit("run from the root of a tbmem checkout")
    if references and not (root / "tbmem" / INTERNAL).is_dir():
        raise SystemExit("--references: tbmem/_internal/ does not exist yet: run without --references first")
    moves, notes = plan(root), []
    clash = [new for _, new in moves if (root / new).exists()]
    if clash:
        raise SystemExit("both the old and the new path exist (merge them by hand, then run again): "
                         + ", ".join(clash))
    if not dry:
        for old, new in moves:
            (root / new).parent.mkdir(parents=True, exist_ok=True)
            git(root, "mv", old, new)
        for pkg in FACADES:
            init = root / "tbmem" / INTERNAL / pkg / "__init__.py"
            if init.parent.is_dir() and not init.exists():
                init.write_text(f'"""The implementation of the public facade :mod:`tbmem.{pkg}`."""\n\n'
                                '__all__: list[str] = []\n')
                git(root, "add", init.relative_to(root).as_posix())
        main_ = root / "tbmem" / "__main__.py"
        if not main_.exists():
            main_.write_text(MAIN)
            git(root, "add", main_.relative_to(root).as_posix())
        init = root / "tbmem" / INTERNAL / "__init__.py"
        if not init.exists():
            init.write_text('"""tbmem\'s own modules: not part of the public API (docs/api.md); they may change '
                            'without notice."""\n\n__all__: list[str] = []\n')
            git(root, "add", init.relative_to(root).as_posix())
        notes += remove_stale_folders(root, dry)
    if dry and moves:
        # what the index would hold after the moves: build it from a throwaway copy of the layout
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            shadow = Path(tmp)
            for rel in git(root, "ls-files", "tbmem").splitlines():
                new = dict(moves).get(rel, rel)
                (shadow / new).parent.mkdir(parents=True, exist_ok=True)
                if (root / rel).is_file():
                    shutil.copyfile(root / rel, shadow / new)
            idx = build_index(shadow)
    else:
        idx = build_index(root)
    rw = Rewriter(idx)
    changed = []
    for rel in text_files(root):
        path = root / rel
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError):
            continue
        new = rw.rewrite(text, rel)
        if new != text:
            changed.append(rel)
            if diff:
                import difflib

                sys.stdout.writelines(difflib.unified_diff(text.splitlines(True), new.splitlines(True), rel, rel, n=0))
            if not dry:
                path.write_text(new, encoding="utf-8")
    return moves, changed, notes + sorted(set(rw.notes))


MOVE_SUBJECT = "issue 36: every module outside the public set moves"
GENERATED = {"docs/api.md"}
#: in the subject of a commit that holds only what this script wrote (its move commit says so too)
MECHANICAL = "nothing by hand"


def resolve_merge(root: Path, move_commit: str | None = None) -> tuple[list[str], list[str]]:
    """During ``git merge`` of the branch that moved the modules: each conflicted file that branch changed only
    mechanically (not after its move commit) takes the merged tree's side (``--ours``), staged; the
    ``--references`` pass then redoes the mechanical part on it. Returns (taken, left for a hand merge)."""
    try:
        git(root, "rev-parse", "-q", "--verify", "MERGE_HEAD")
    except subprocess.CalledProcessError:
        raise SystemExit("--resolve-merge: no merge in progress (git merge the move's branch first)") from None
    if move_commit is None:
        found = git(root, "log", "MERGE_HEAD", "--format=%H", "--fixed-strings", f"--grep={MOVE_SUBJECT}").split()
        if not found:
            raise SystemExit(f"--resolve-merge: no commit '{MOVE_SUBJECT}...' on MERGE_HEAD: name it (--move-commit)")
        move_commit = found[-1]
    by_hand_after: set[str] = set()  # what the commits after the move changed, but this script's own passes
    for line in git(root, "log", "--format=%H %s", f"{move_commit}..MERGE_HEAD").splitlines():
        commit, _, subject = line.partition(" ")
        if MECHANICAL not in subject:
            by_hand_after.update(git(root, "diff-tree", "--no-commit-id", "--name-only", "-r", commit).split())
    taken, left = [], []
    for rel in sorted(set(git(root, "diff", "--name-only", "--diff-filter=U").split())):
        stages = {line.split()[2] for line in git(root, "ls-files", "-u", "--", rel).splitlines()}
        new = new_path(rel)
        if new is not None and stages == {"1", "2"} and (root / new).exists():
            # edited at its old path, moved by the branch (git saw a deletion: a small file, much rewritten):
            # the edited text goes to the new path, where the references pass rewrites it
            if new in by_hand_after:
                left.append(rel)
                continue
            text = subprocess.run(["git", "show", f":2:{rel}"], cwd=root, check=True, capture_output=True).stdout
            git(root, "rm", "-q", "--cached", "--", rel)
            (root / rel).unlink(missing_ok=True)
            (root / new).write_bytes(text)
            git(root, "add", "--", new)
            taken.append(f"{rel} -> {new}")
            continue
        if rel in GENERATED:  # regenerated after the merge: either side will do
            git(root, "checkout", "--theirs", "--", rel)
            git(root, "add", "--", rel)
            taken.append(f"{rel} (regenerate it: python -m tbmem._internal._apidoc)")
            continue
        if rel in by_hand_after:
            left.append(rel)
            continue
        try:
            git(root, "checkout", "--ours", "--", rel)
        except subprocess.CalledProcessError:  # no "ours" side (deleted there): the hand merge decides
            left.append(rel)
            continue
        git(root, "add", "--", rel)
        taken.append(rel)
    return taken, left


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--references", action="store_true", help="the pass after a merge (the move already done)")
    ap.add_argument("--dry-run", action="store_true", help="print what would change, change nothing")
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if anything would change")
    ap.add_argument("--diff", action="store_true", help="with --dry-run or --check: print the rewrites as a diff")
    ap.add_argument("--resolve-merge", action="store_true",
                    help="during the merge of the move's branch: conflicted files it changed only mechanically "
                         "take the merged tree's side; lists the files left to merge by hand")
    ap.add_argument("--move-commit", help="with --resolve-merge: the move's commit (default: found by its subject)")
    ap.add_argument("--root", type=Path, default=Path.cwd(), help="the checkout (default: the current folder)")
    args = ap.parse_args(argv)
    if args.resolve_merge:
        taken, left = resolve_merge(args.root.resolve(), args.move_commit)
        print(f"{len(taken)} conflicted files take the merged tree's side (the --references pass redoes the move's "
              f"rewrite on them); {len(left)} to merge by hand:" + "".join(f"\n  {f}" for f in left))
        return 0
    dry = args.dry_run or args.check
    moves, changed, notes = run(args.root.resolve(), references=args.references, dry=dry, diff=dry and args.diff)
    print(f"{len(moves)} files {'to move' if dry else 'moved'}, {len(changed)} files "
          f"{'to rewrite' if dry else 'rewritten'}")
    if dry:
        print("".join(f"  mv {o} {n}\n" for o, n in moves) + "".join(f"  rewrite {c}\n" for c in changed), end="")
    print("".join(n + "\n" for n in notes), end="")
    if args.check:
        return 1 if moves or changed else 0
    if not dry and (moves or changed):
        print("now: python setup.py build_ext --inplace; python -m tbmem._internal._apidoc; the tests")
    return 0


if __name__ == "__main__":
    sys.exit(main())
