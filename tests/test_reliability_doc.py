"""docs/reliability.md stays current: every test its fault table names exists, and every fault test is named."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "reliability.md"
_TEST_ID = re.compile(r"`(tests/[\w/]+\.py)::(test_\w+)`")


def _rows() -> list[list[str]]:
    lines = DOC.read_text().splitlines()
    start = lines.index("| case | what happens | what is kept | tests |")
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split(" | ")])
    return rows


def _test_functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}


def test_every_case_has_an_outcome_and_tests_that_exist():
    rows = _rows()
    assert len(rows) >= 15
    for case, happens, kept, tests in rows:
        assert case and happens and kept, case
        ids = _TEST_ID.findall(tests)
        assert ids, f"the case {case!r} names no test"
        for path, name in ids:
            assert (ROOT / path).is_file(), f"{case!r}: {path} does not exist"
            assert name in _test_functions(ROOT / path), f"{case!r}: {path} has no {name}"


def test_every_fault_test_is_in_the_table():
    named = {f"{path}::{name}" for *_, tests in _rows() for path, name in _TEST_ID.findall(tests)}
    for path in sorted((ROOT / "tests" / "faults").glob("test_*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for name in sorted(_test_functions(path)):
            assert f"{rel}::{name}" in named, f"{rel}::{name} is not in docs/reliability.md's fault table"
