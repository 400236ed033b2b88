"""The drawn public API (docs/api.md): what ``tbmem.__all__`` and the public modules name, and that the
bundled trainers and the framework integrations use nothing else of tbmem."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from pathlib import Path

import pytest

import tbmem

ROOT = Path(__file__).resolve().parents[1]
#: The public modules: tbmem itself, those tbmem.PUBLIC_MODULES names, and the integrations' modules.
PUBLIC_PREFIXES = ("tbmem.integrations",)


def public_module(name: str) -> bool:
    return name == "tbmem" or name in tbmem.PUBLIC_MODULES or any(
        name.startswith(p + ".") for p in PUBLIC_PREFIXES)


def non_public_imports(path: Path) -> list[str]:
    """``file:line: import`` for each import in ``path`` of tbmem that is neither a public module nor a
    name of one (``from tbmem import MemoryWriter`` is public, ``from tbmem._internal.writer import ...`` is not)."""
    bad = []
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.split(".")[0] == "tbmem"]
            bad += [f"{path.relative_to(ROOT)}:{node.lineno}: import {n}" for n in names if not public_module(n)]
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "tbmem":
            module = node.module or ""
            for alias in node.names:
                if public_module(module) and not alias.name.startswith("_"):
                    continue
                if public_module(f"{module}.{alias.name}"):  # from tbmem import console
                    continue
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: from {module} import {alias.name}")
    return bad


def adapter_files() -> list[Path]:
    files = sorted((ROOT / "trainers").rglob("*.py"))
    integrations = ROOT / "tbmem" / "integrations"
    return files + (sorted(integrations.rglob("*.py")) if integrations.is_dir() else [])


#: What users read and type: the README, docs/ (architecture.md is the developers' map of tbmem/_internal/), the
#: notebook, the examples, the Makefile and the trainers' configs.
USER_TEXT = ("README.md", "Makefile", "docs/*.md", "notebooks/*.ipynb", "examples/*.py", "conf/**/*.yaml")
DEVELOPER_TEXT = ("docs/architecture.md",)
_TO_TYPE = re.compile(r"tbmem\._internal\.\w|-m tbmem\.\w")


def internal_names(text: str) -> list[str]:
    """The lines of ``text`` that ask for something of tbmem._internal by name (an import, a call, ``python -m``)
    or run a module of tbmem with ``python -m tbmem.x`` (the ``tbmem`` command does that). A path such as
    ``tbmem/_internal/census/heap.py`` says where code is and is not something to type."""
    return [line.strip() for line in text.splitlines() if _TO_TYPE.search(line)]


def user_files() -> list[Path]:
    return sorted({p for pattern in USER_TEXT for p in ROOT.glob(pattern)
                   if p.is_file() and p.relative_to(ROOT).as_posix() not in DEVELOPER_TEXT})


def _read(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    return text.split("\n## Moved in 0.2\n", 1)[0]  # api.md's table of 0.1's names, as they were


def test_what_users_read_asks_for_nothing_internal():
    files = user_files()
    assert len(files) > 20 and ROOT / "README.md" in files and ROOT / "docs" / "snapshots.md" in files
    bad = [f"{p.relative_to(ROOT)}: {line}" for p in files for line in internal_names(_read(p))]
    assert not bad, ("what users read names tbmem's own modules (use a public name, docs/api.md, or the tbmem "
                     "command; a file path is fine):\n" + "\n".join("  " + b for b in bad))


def test_examples_import_only_public_names():
    bad = [line for path in sorted((ROOT / "examples").glob("*.py")) for line in non_public_imports(path)]
    assert not bad, "\n".join(bad)


# move_internal_modules: keep (0.1's command, as the example the check must catch)
def test_the_user_text_check_can_fail():
    text = ("from tbmem._internal.census import heap\nsee tbmem/_internal/census/heap.py\n"
            "python -m tbmem.cli report runs\npython -m tbmem report runs\nthe tbmem._internal package\n")
    assert internal_names(text) == ["from tbmem._internal.census import heap", "python -m tbmem.cli report runs"]
# move_internal_modules: end


def test_trainers_and_integrations_import_only_public_names():
    bad = [line for path in adapter_files() for line in non_public_imports(path)]
    assert not bad, "imports of tbmem's own modules (use what tbmem.__all__ or docs/api.md's modules name):\n" + \
        "\n".join("  " + b for b in bad)


def test_the_import_check_can_fail(tmp_path, monkeypatch):
    monkeypatch.setattr(tbmem, "PUBLIC_MODULES", ("tbmem.console",))
    src = ROOT / "trainers" / "_made_up_for_the_test.py"
    text = ("import tbmem\nfrom tbmem import MemoryWriter, _log\nfrom tbmem.console import emit\n"
            "from tbmem._internal.monitor.readings import read\nimport tbmem._internal._torch_private as tp\n"
            "from tbmem import console\nfrom tbmem.integrations.lightning import Callback\n")
    src.write_text(text)
    try:
        found = non_public_imports(src)
    finally:
        src.unlink()
    assert [f.split(": ", 1)[1] for f in found] == [
        "from tbmem import _log", "from tbmem._internal.monitor.readings import read", "import tbmem._internal._torch_private"]


@pytest.mark.parametrize("name", sorted(tbmem.__all__))
def test_every_top_level_name_resolves(name):
    assert getattr(tbmem, name) is not None
    assert name in dir(tbmem) or name in vars(tbmem)


def test_every_config_class_is_at_the_top():
    import dataclasses

    from tbmem._internal.config import MemoryWriterConfig

    for field in dataclasses.fields(MemoryWriterConfig):
        default = field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
        kind = type(default)
        if kind.__name__.endswith("Config"):
            assert getattr(tbmem, kind.__name__) is kind, field.name
    for name in ("MemoryWriterConfig", "SnapshotConfig", "RanksConfig", "AlertConfig", "SpikeConfig",
                 "ProfileConfig"):
        assert name in tbmem.__all__


@pytest.mark.parametrize("module", sorted(tbmem.PUBLIC_MODULES))
def test_public_modules_name_what_they_export(module):
    if module == "tbmem.integrations" and not (ROOT / "tbmem" / "integrations").is_dir():
        pytest.skip("tbmem.integrations is reserved: issue 37 adds it")
    mod = importlib.import_module(module)
    for name in mod.__all__:
        assert getattr(mod, name) is not None, (module, name)


def _listed(page: str, module: str) -> list[str]:
    """The names docs/api.md lists in ``module``'s section."""
    section = page.split(f"## `{module}`\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^- `([A-Za-z_][A-Za-z0-9_]*)", section, flags=re.M)


def test_the_api_page_is_current_and_names_exactly_the_public_names():
    from tbmem._internal import _apidoc

    page = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    assert page == _apidoc.render(), "docs/api.md is not current: run python -m tbmem._internal._apidoc"
    assert _apidoc.render() == page  # regenerating gives the same text
    assert sorted(_listed(page, "tbmem")) == sorted(n for n in tbmem.__all__ if not n.startswith("__"))
    for module in tbmem.PUBLIC_MODULES:
        assert f"## `{module}`" in page
        if importlib.util.find_spec(module) is not None:
            assert sorted(_listed(page, module)) == sorted(importlib.import_module(module).__all__), module


def test_the_page_check_fails_on_a_stale_page(tmp_path, monkeypatch):
    from tbmem._internal import _apidoc

    monkeypatch.setattr(_apidoc, "PAGE", tmp_path / "api.md")
    (tmp_path / "api.md").write_text(_apidoc.render().replace("- `take_census", "- `take_a_census"))
    assert _apidoc.main(["--check"]) == 1
    assert _apidoc.main([]) == 0 and _apidoc.main(["--check"]) == 0
