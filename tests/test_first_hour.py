"""What a new user reads and runs first agrees with itself: the install shows progress, the README's
numbers are docs/benchmarks.md's, and it says what the tests need from outside the clone."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _benchmark_facts() -> dict[str, str]:
    """benchmark or fact -> its number in bold, from the table at the top of docs/benchmarks.md."""
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    table = text.split("## Current numbers")[1].split("\n## ")[0]
    rows = [r.split(" | ") for r in table.splitlines() if r.startswith("| ") and "**" in r.split(" | ")[1]]
    return {fact.strip("| `"): re.search(r"\*\*(.+?)\*\*", number)[1] for fact, number, *_ in rows}


def test_the_install_shows_its_progress():
    recipe = (ROOT / "Makefile").read_text().split("$(STAMP):", 1)[1].split("\n\n")[0]
    (pip,) = [line for line in recipe.splitlines() if "pip install" in line]
    assert not re.search(r"\s(-q|--quiet)\b", pip)  # 142 s of silence before
    assert "@echo" in recipe


def test_the_readme_quotes_the_benchmarks_numbers():
    facts = _benchmark_facts()
    readme = (ROOT / "README.md").read_text()
    defaults, census = facts["trainer.epoch_defaults_vs_off"], facts["trainer.epoch_census_50_vs_off"]
    # every overhead claim of the README is one of these, with the date they were measured
    claims = re.findall(r"([+-]\d+(?:\.\d+)?%) (?:with tbmem's defaults|at the defaults|with a census)", readme)
    assert claims and set(claims) == {defaults.split()[0], census.split()[0]}
    assert "2026-11-24" in readme.split("Near-zero overhead")[1][:300]
    demo = facts["demo: a later `make demo` (`.venv` and the simulations kept)"]
    assert f"Later demos reuse them and take about {demo}" in readme
    trainers = (ROOT / "docs" / "trainers.md").read_text()
    quick = facts["demo: `burgers_quick_test trainer=synthetic_with_memory`, wall"]
    assert f"# ~{quick} on 2 CPU cores" in trainers and f"`burgers_quick_test trainer=synthetic_with_memory`: {quick} wall" in trainers


def test_the_readme_says_what_the_tests_need_from_outside_the_clone():
    readme = (ROOT / "README.md").read_text()
    assert "apt-get install chromium" in readme and "../shared/" in readme
    for test in ("tests/plugin/test_browser.py", "tests/snapshot/test_viewer.py"):
        assert test in readme and (ROOT / test).exists()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "export TBMEM_REQUIRE_SHARED=1" in ci and "export TBMEM_REQUIRE_BROWSER=1" in ci
