"""Each adapter uses tbmem's public API only, stays small, and names its extra when its framework is missing."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import tbmem

ROOT = Path(__file__).resolve().parents[2]
ADAPTERS = sorted((ROOT / "tbmem" / "integrations").glob("[!_]*.py"))
#: the one private module an adapter may import: how tbmem imports an optional dependency
ALLOWED_PRIVATE = {"tbmem._internal._extras"}


def test_the_adapters_are_there():
    assert [p.stem for p in ADAPTERS] == ["accelerate", "lightning", "transformers"]


@pytest.mark.parametrize("path", ADAPTERS, ids=lambda p: p.stem)
def test_only_public_names_of_tbmem(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tbmem"):
            if node.module == "tbmem":
                assert {a.name for a in node.names} <= set(tbmem.__all__), ast.dump(node)
            else:
                assert node.module in ALLOWED_PRIVATE, node.module
        elif isinstance(node, ast.Import):
            assert not any(a.name.startswith("tbmem") for a in node.names)
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            # no writer internals: an underscored attribute only of the adapter's own object or a framework's
            base = node.value
            assert isinstance(base, ast.Name) and base.id in ("self", "loop", "accelerator", "model", "frame",
                                                               "sys"), ast.unparse(node)
    assert len(path.read_text().splitlines()) <= 200


@pytest.mark.parametrize(("module", "blocked", "extra"), [
    ("transformers", "transformers", "transformers"), ("accelerate", "accelerate", "accelerate"),
    ("lightning", "lightning", "lightning")])
def test_a_missing_framework_names_its_extra(module, blocked, extra):
    block = f"sys.modules[{blocked!r}] = None" + ("; sys.modules['pytorch_lightning'] = None"
                                                  if blocked == "lightning" else "")
    code = (f"import sys; {block}\nfrom tbmem import MissingExtraError\ntry:\n"
            f"    import tbmem.integrations.{module}\nexcept MissingExtraError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert f"pip install 'tbmem[{extra}]'" in out.stdout, out.stderr
