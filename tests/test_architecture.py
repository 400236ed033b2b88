"""The structure of tbmem read from its source with ``ast``: no import cycle, each module in the layer
docs/architecture.md's table files it in and importing only its own layer and those below,
``tbmem._internal.logdir`` torch-free, and no function over the complexity limit of pyproject.toml.

What counts as an import (the rule docs/architecture.md states):

* every ``import`` and ``from ... import`` in a file, at module level or inside a function or a
  class (a deferred import is still a dependency: it runs, and a cycle made of deferred imports is
  still a cycle, only one that fails later); imports under ``if TYPE_CHECKING:`` do not run and
  do not count;
* an import names the module it loads: ``import a.b.c`` and ``from a.b.c import x`` depend on
  ``a.b.c``; ``from a.b import c`` depends on ``a.b.c`` when ``c`` is a module, else on ``a.b``
  (the package's ``__init__``, which must then have defined ``c``: a re-export);
* the parent packages Python initialises on the way (``a`` and ``a.b`` for ``import a.b.c``) are
  not edges: every module would depend on its package's ``__init__``, and a package that
  re-exports its submodules would form a cycle with each of them, one Python resolves (the
  package exists before its submodules run). A submodule that imports a *name* from its own
  package's ``__init__`` is an edge, and the cycle it makes with a re-exporting ``__init__`` is
  a real one (which of the two runs first decides whether the name exists yet);
* names resolved at run time from strings (``tbmem._internal._lazy.lazy_exports`` tables,
  ``importlib.import_module``, ``sys.modules`` lookups) are not imports.

Run ``python tests/test_architecture.py`` for the whole report (cycles, upward imports, layers).
"""

from __future__ import annotations

import ast
import fnmatch
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("tbmem", "trainers")
#: The readers: they read a logdir (the Memory tab, ``tbmem report`` and the analysis API, forecasts,
#: the command line). Nothing of the core imports them.
READERS = ("tbmem._internal.plugin", "tbmem.analysis", "tbmem._internal.analysis", "tbmem.forecast",
           "tbmem._internal.forecast", "tbmem._internal.cli", "tbmem.__main__")
#: Adapters above everything of tbmem: nothing of tbmem imports them but the command lines that run them.
ADAPTERS = ("trainers", "tbmem.integrations")
#: What ``tbmem`` runs: may import anything (``tbmem forecast`` builds the trainer of a Hydra config).
ENTRY_POINTS = ("tbmem._internal.cli", "tbmem._internal.forecast.cli", "tbmem.__main__")
#: The run layout and its formats: imports nothing of tbmem but itself, the tag table and the
#: private helpers (``tbmem._internal._*``), and no torch.
LOGDIR = "tbmem._internal.logdir"
#: Where the complexity limit applies (ruff's C901 with pyproject.toml's max-complexity).
SIZE_ROOTS = ("tbmem", "trainers", "tests", "benchmarks", "scripts")
DOC = ROOT / "docs" / "architecture.md"
#: The writer's components and what they wrap (docs/architecture.md, "the recorder"): they emit through
#: ``tbmem._internal._emit.Emitter`` and never import, name or hold the writer.
COMPONENT_MODULES = ("tbmem._internal._writer_components", "tbmem._internal._emit", "tbmem._internal.alerts", "tbmem._internal.spikes", "tbmem._internal.profile",
                     "tbmem._internal.snapshot", "tbmem._internal.ranks", "tbmem._internal.census", "tbmem._internal.probes", "tbmem._internal.sinks")
#: The writer: its modules and classes.
WRITER_MODULES = ("tbmem._internal.writer", "tbmem._internal._writer_base", "tbmem._internal._writer_record", "tbmem._internal._writer_steps")
WRITER_NAMES = frozenset({"MemoryWriter", "WriterBase", "RecordPipeline", "StepHooks"})
#: The public modules besides tbmem.PUBLIC_MODULES: the package itself and ``python -m tbmem``; everything below
#: these two packages is public too (docs/api.md). Every other module of tbmem lives in tbmem._internal.
PUBLIC_EXTRA = ("tbmem", "tbmem.__main__")
PUBLIC_PACKAGES = ("tbmem.console", "tbmem.integrations")
INTERNAL = "tbmem._internal"

# --- Known remaining violations, removed as the work that fixes them is merged -----------------------
# Each entry names the issue whose branch changes these files; the test fails on anything not listed
# here and on an entry that no longer applies (then delete it).
KNOWN_EDGES: dict[tuple[str, str], str] = {}
#: Imports against the layers of docs/architecture.md, (module, imported module) -> the issue that fixes it.
KNOWN_LAYER_EDGES: dict[tuple[str, str], str] = {}


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every module of :data:`PACKAGES`: each ``.py``, and each C
    extension by its source (``tbmem/_internal/census/_gcwalk.c`` is ``tbmem._internal.census._gcwalk``; it imports
    nothing)."""
    mods = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")) + sorted((ROOT / pkg).rglob("*.c")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            mods[".".join(parts)] = path
    return mods


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imported_names(path: Path, module: str) -> set[str]:
    """The dotted names ``path``'s imports load (``from a import b`` gives ``a.b`` and ``a``; the
    caller keeps what is a module), outside ``if TYPE_CHECKING:``."""
    is_pkg = path.name == "__init__.py"
    package = module if is_pkg else module.rpartition(".")[0]
    names: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child.test):
                for sub in child.orelse:  # the else branch of `if TYPE_CHECKING:` runs
                    visit(ast.Module(body=[sub], type_ignores=[]))
                continue
            if isinstance(child, ast.Import):
                names.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    base = ".".join(up + ([child.module] if child.module else []))
                for alias in child.names:
                    names.add(f"{base}.{alias.name}\0{base}")  # the submodule, else the package
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
    return names


def import_graph() -> dict[str, set[str]]:
    """module -> the modules of tbmem and trainers it imports (the rule in this module's docstring)."""
    mods = module_files()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for mod, path in mods.items():
        deps = set()
        for name in imported_names(path, mod) if path.suffix == ".py" else ():
            sub, _, base = name.partition("\0")
            target = sub if sub in mods else resolve(base or sub)
            if target is not None and target != mod:
                deps.add(target)
        graph[mod] = deps
    return graph


def third_party(path: Path, module: str) -> set[str]:
    """Top-level names of what ``path`` imports from outside tbmem and trainers."""
    tops = set()
    for name in imported_names(path, module):
        top = name.partition("\0")[0].split(".")[0]
        if top and top not in PACKAGES:
            tops.add(top)
    return tops


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        comp.append(top)
                        if top == node:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return sorted(found)


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports of a reader or an adapter from the core, of an adapter from tbmem (but its command lines),
    and out of the logdir package's floor."""
    bad = []
    for mod, deps in sorted(graph.items()):
        for dep in sorted(deps):
            if _under(mod, ENTRY_POINTS):
                continue
            if _under(dep, ADAPTERS) and not _under(mod, ADAPTERS):
                bad.append(f"{mod} -> {dep}: tbmem imports the trainers")
            elif _under(dep, READERS) and not _under(mod, READERS + ADAPTERS):
                bad.append(f"{mod} -> {dep}: the core imports a reader")
            elif _under(mod, (LOGDIR,)) and not (_under(dep, (LOGDIR,)) or dep == "tbmem._internal.tags"
                                                  or dep.startswith("tbmem._internal._")):
                bad.append(f"{mod} -> {dep}: tbmem._internal.logdir imports above itself")
    return bad


def torch_reached(graph: dict[str, set[str]], start: str) -> list[str]:
    """The modules below ``start`` (itself and everything it imports, transitively) that import torch."""
    mods = module_files()
    seen, todo = set(), [m for m in graph if _under(m, (start,))]
    while todo:
        mod = todo.pop()
        if mod not in seen:
            seen.add(mod)
            todo.extend(graph[mod])
    return sorted(m for m in seen if mods[m].suffix == ".py" and "torch" in third_party(mods[m], m))


def doc_layers(text: str | None = None) -> list[tuple[str, list[str]]]:
    """``(layer, [path patterns])`` from bottom to top: the table of docs/architecture.md whose header is
    ``| layer | modules | imports |`` (each backticked path of the modules column is a pattern)."""
    text = DOC.read_text(encoding="utf-8") if text is None else text
    rows = text.split("| layer | modules | imports |", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    out = []
    for row in rows:
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        out.append((cells[0], re.findall(r"`([^`]+)`", cells[1])))
    return out


def layer_of(path: str, layers: list[tuple[str, list[str]]]) -> str | None:
    """The layer of the longest pattern naming ``path`` (``tbmem/x/`` a package and all below it)."""
    best: tuple[int, str] | None = None
    for layer, patterns in layers:
        for pat in patterns:
            hit = path.startswith(pat) if pat.endswith("/") else fnmatch.fnmatchcase(path, pat)
            if hit and (best is None or len(pat) > best[0]):
                best = (len(pat), layer)
    return best[1] if best else None


def layer_violations(graph: dict[str, set[str]], layers: list[tuple[str, list[str]]],
                     paths: dict[str, str] | None = None) -> list[str]:
    """Modules no layer files, and imports of a module from a layer above its own (entry points excepted);
    ``paths``: module -> repository path (default: every module of :data:`PACKAGES`)."""
    if paths is None:
        paths = {m: p.relative_to(ROOT).as_posix() for m, p in module_files().items()}
    rank = {layer: i for i, (layer, _) in enumerate(layers)}
    where = {m: layer_of(path, layers) for m, path in paths.items()}
    bad = [f"{m}: in no layer of docs/architecture.md" for m, lay in sorted(where.items()) if lay is None]
    for mod, deps in sorted(graph.items()):
        if where.get(mod) is None or _under(mod, ENTRY_POINTS):
            continue
        for dep in sorted(deps):
            low, high = where.get(dep), where[mod]
            if low is not None and rank[low] > rank[high]:
                bad.append(f"{mod} ({high}) -> {dep} ({low})")
    return bad


def outside_internal(modules: list[str], public_modules: tuple[str, ...]) -> list[str]:
    """The modules of tbmem neither public (``public_modules``, :data:`PUBLIC_EXTRA`, below
    :data:`PUBLIC_PACKAGES`) nor under tbmem._internal."""
    return sorted(m for m in modules if m.split(".")[0] == "tbmem" and m not in public_modules + PUBLIC_EXTRA
                  and not _under(m, PUBLIC_PACKAGES + (INTERNAL,)))


def too_complex() -> list[str]:
    """Functions over pyproject.toml's McCabe limit, as ruff reports them."""
    targets = [p for p in SIZE_ROOTS if (ROOT / p).is_dir()] + sorted(p.name for p in ROOT.glob("*.py"))
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--select", "C901",
                           "--output-format", "concise", *targets], cwd=ROOT, capture_output=True, text=True,
                          check=False)
    assert done.returncode in (0, 1), done.stderr
    return [line for line in done.stdout.splitlines() if "C901" in line]


# --- the tests ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_no_import_cycle(graph):
    listed = {edge for edge in KNOWN_EDGES if edge[1] in graph.get(edge[0], ())}
    pruned = {m: {d for d in deps if (m, d) not in KNOWN_EDGES} for m, deps in graph.items()}
    found = cycles(pruned)
    assert not found, "import cycles (docs/architecture.md says how to break one):\n" + "\n".join(
        "  " + " <-> ".join(c) for c in found)
    stale = sorted(set(KNOWN_EDGES) - listed)
    assert not stale, f"KNOWN_EDGES entries no longer imported (remove them): {stale}"
    needed = [e for e in sorted(listed) if not cycles({**pruned, e[0]: pruned[e[0]] | {e[1]}})]
    assert not needed, f"KNOWN_EDGES entries that no longer close a cycle (remove them): {needed}"


def test_core_never_imports_the_readers(graph):
    bad = upward_imports(graph)
    assert not bad, "upward imports (docs/architecture.md):\n" + "\n".join("  " + b for b in bad)


def test_logdir_is_torch_free(graph):
    assert torch_reached(graph, LOGDIR) == []


def test_each_module_imports_only_its_layer_and_below(graph):
    layers = doc_layers()
    assert [name for name, _ in layers] == ["base", "logdir", "core", "recorder", "console", "readers",
                                           "adapters"], "docs/architecture.md's layer table changed"
    found = layer_violations(graph, layers)

    def known(line: str, edge: tuple[str, str]) -> bool:
        return line.startswith(f"{edge[0]} (") and f"-> {edge[1]} (" in line

    new = [b for b in found if not any(known(b, e) for e in KNOWN_LAYER_EDGES)]
    stale = [e for e in KNOWN_LAYER_EDGES if not any(known(b, e) for b in found)]
    assert not stale, f"KNOWN_LAYER_EDGES entries that no longer apply (remove them): {stale}"
    assert not new, "imports against docs/architecture.md's layers, or modules it does not file:\n" + "\n".join(
        "  " + b for b in new)


def writer_references(source: str, where: str) -> list[str]:
    """``where:line: what`` for each reference to the writer in ``source``: an import of a writer module
    (under ``TYPE_CHECKING`` too: a component typed with the writer holds one), or the name of a writer
    class in code (docstrings and comments may name it)."""
    found = []
    for node in ast.walk(ast.parse(source, where)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            names += [a.name for a in node.names if a.name in WRITER_NAMES]
        elif isinstance(node, ast.Name) and node.id in WRITER_NAMES:
            names = [node.id]
        elif isinstance(node, ast.Attribute) and node.attr in WRITER_NAMES:
            names = [node.attr]
        elif isinstance(node, ast.Constant) and node.value in WRITER_NAMES:  # a string annotation
            names = [str(node.value)]
        bad = [n for n in names if n in WRITER_NAMES or n in WRITER_MODULES
               or any(n.startswith(m + ".") for m in WRITER_MODULES)]
        found += [f"{where}:{getattr(node, 'lineno', 0)}: {n}" for n in bad]
    return found


def test_no_component_module_references_the_writer():
    mods = module_files()
    files = [(m, p) for m, p in mods.items() if p.suffix == ".py"
             and any(m == c or m.startswith(c + ".") for c in COMPONENT_MODULES)]
    assert len(files) > 40 and any(m == "tbmem._internal._writer_components" for m, _ in files)
    bad = [line for m, p in files for line in writer_references(p.read_text(encoding="utf-8"), m)]
    assert not bad, ("the writer's components reference the writer (they emit through tbmem._internal._emit.Emitter, "
                     "docs/architecture.md):\n" + "\n".join("  " + b for b in bad))
    # the check can fail
    assert writer_references("from tbmem._internal.writer import MemoryWriter\n", "x") == [
        "x:1: tbmem._internal.writer", "x:1: tbmem._internal.writer.MemoryWriter", "x:1: MemoryWriter"]
    assert writer_references("if TYPE_CHECKING:\n    from tbmem._internal import _writer_base\n", "x") == [
        "x:2: tbmem._internal._writer_base"]
    assert writer_references('def f(w: "MemoryWriter"):\n    """a MemoryWriter"""\n', "x") == ["x:1: MemoryWriter"]


def test_the_writer_reaches_tensorboard_only_through_its_sink(graph):
    """One output path: the writer's modules write events through the sinks (TensorBoard's first,
    tbmem/_internal/sinks/tensorboard.py), never through TensorBoard's internals or the event encoders (the
    writer's fault ledger, ``tbmem._internal._safe_io.FaultLedger``, counts what any part could not write)."""
    internals = {"tbmem._internal._tensorboard_private", "tbmem._internal._direct_events", "tbmem._internal._fastcrc"}
    bad = sorted(f"{m} -> {d}" for m in WRITER_MODULES for d in graph[m] & internals)
    assert not bad, "the writer reaches TensorBoard besides its sink:\n" + "\n".join("  " + b for b in bad)
    assert internals & graph["tbmem._internal.sinks.tensorboard"]  # the check can fail: the sink does


def test_no_function_over_the_complexity_limit():
    found = too_complex()
    assert not found, ("functions over [tool.ruff.lint.mccabe] max-complexity (split them by what their "
                       "parts do):\n" + "\n".join("  " + f for f in found))


def test_every_module_outside_the_public_set_is_internal():
    import tbmem

    bad = outside_internal(list(module_files()), tuple(tbmem.PUBLIC_MODULES))
    assert not bad, ("modules neither public (docs/api.md) nor under tbmem._internal (move them: "
                     "python scripts/move_internal_modules.py --references):\n" + "\n".join("  " + b for b in bad))


def test_every_path_the_architecture_doc_names_exists():
    """docs/architecture.md names files as they are: each backticked ``tbmem/...`` path (a glob too) exists."""
    paths = sorted(set(re.findall(r"`(tbmem/[^`\s]*)`", DOC.read_text(encoding="utf-8"))))
    missing = [p for p in paths if not (list(ROOT.glob(p.rstrip("/"))) if any(c in p for c in "*?[")
                                        else (ROOT / p).exists())]
    assert len(paths) > 40 and not missing, f"docs/architecture.md names paths that do not exist: {missing}"


# move_internal_modules: keep (0.1's names, as examples)
def test_no_reference_to_a_module_at_its_old_path():
    """Nothing is left for scripts/move_internal_modules.py to move or rewrite: no file at an old path, no
    ``tbmem.census`` or ``tbmem/census/`` for what lives in tbmem/_internal/ (in code, docs, the Makefile)."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout (the script reads git's file list)")
    done = subprocess.run([sys.executable, "scripts/move_internal_modules.py", "--references", "--check"], cwd=ROOT,
                          capture_output=True, text=True, check=False, timeout=300)
    assert done.returncode == 0, ("run python scripts/move_internal_modules.py --references:\n" + done.stdout
                                  + done.stderr)


# --- the checker checked: each rule fails where it should ------------------------------------------------
def test_the_internal_rule_on_made_up_modules():
    mods = ["tbmem", "tbmem.__main__", "tbmem.console", "tbmem.analysis", "tbmem.integrations.lightning",
            "tbmem._internal", "tbmem._internal.census.core", "tbmem.census", "tbmem._log", "tbmem.analysis.load",
            "trainers.config"]
    assert outside_internal(mods, ("tbmem.console", "tbmem.analysis", "tbmem.integrations")) == [
        "tbmem._log", "tbmem.analysis.load", "tbmem.census"]
# move_internal_modules: end


def test_rules_on_a_made_up_graph():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    bad = upward_imports({"tbmem._internal.writer": {"tbmem._internal.plugin.paths"},
                          "tbmem._internal.logdir.x": {"tbmem._internal.snapshot"},
                          "tbmem._internal.logdir.y": {"tbmem._internal._log", "tbmem._internal.tags"},
                          "tbmem._internal.analysis.load": {"tbmem._internal.logdir.x"},
                          "tbmem._internal.tags": {"trainers.config"},
                          "tbmem._internal.forecast.cli": {"trainers.config"}})
    assert bad == ["tbmem._internal.logdir.x -> tbmem._internal.snapshot: tbmem._internal.logdir imports above itself",
                   "tbmem._internal.tags -> trainers.config: tbmem imports the trainers",
                   "tbmem._internal.writer -> tbmem._internal.plugin.paths: the core imports a reader"]


# move_internal_modules: keep (made-up names: the rules read them as they are)
def test_layer_rule_on_a_made_up_table():
    table = ("| layer | modules | imports |\n|---|---|---|\n| base | `tbmem/_*.py` | - |\n"
             "| core | `tbmem/census/`, `tbmem/_writer_*.py` | - |\n| readers | `tbmem/cli.py` | - |\n\nafter")
    layers = doc_layers(table)
    assert layers == [("base", ["tbmem/_*.py"]), ("core", ["tbmem/census/", "tbmem/_writer_*.py"]),
                      ("readers", ["tbmem/cli.py"])]
    assert layer_of("tbmem/_writer_steps.py", layers) == "core"  # the longer pattern wins
    assert layer_of("tbmem/_log.py", layers) == "base" and layer_of("tbmem/writer.py", layers) is None
    paths = {"tbmem._log": "tbmem/_log.py", "tbmem.census.core": "tbmem/census/core.py",
             "tbmem._writer_steps": "tbmem/_writer_steps.py", "tbmem.spikes": "tbmem/spikes.py",
             "tbmem.cli": "tbmem/cli.py"}
    graph = {"tbmem._log": {"tbmem.census.core"}, "tbmem._writer_steps": {"tbmem.census.core", "tbmem._log"},
             "tbmem.census.core": set(), "tbmem.spikes": set(), "tbmem.cli": {"tbmem.spikes"}}
    assert layer_violations(graph, layers, paths) == [
        "tbmem.spikes: in no layer of docs/architecture.md", "tbmem._log (base) -> tbmem.census.core (core)"]


def test_import_rule(tmp_path):
    """Deferred imports count, TYPE_CHECKING ones do not; ``from pkg import name`` is the package
    unless ``name`` is a submodule."""
    src = tmp_path / "m.py"
    src.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import tbmem.plugin\n"
                   "def f():\n    from tbmem.census import take_census\n    from tbmem import tags\n")
    names = {n.partition("\0")[0] for n in imported_names(src, "tbmem.m")}
    assert "tbmem.plugin" not in names and {"tbmem.census.take_census", "tbmem.tags"} <= names
# move_internal_modules: end


if __name__ == "__main__":  # the report, by hand
    g = import_graph()
    print("cycles:", *([" <-> ".join(c) for c in cycles(g)] or ["none"]), sep="\n  ")
    print("upward imports:", *(upward_imports(g) or ["none"]), sep="\n  ")
    print("against the layers:", *(layer_violations(g, doc_layers()) or ["none"]), sep="\n  ")
    print("torch below tbmem._internal.logdir:", torch_reached(g, LOGDIR) or "none")
    print("too complex:", *(too_complex() or ["none"]), sep="\n  ")
    sys.exit(0)
