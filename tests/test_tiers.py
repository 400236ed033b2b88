"""The test suite's two tiers: ``make test`` (the fast tier and one end-to-end run of each trainer) and
``make test-all`` (everything; what CI runs). tests/slow.txt names the slow tier."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _listed() -> list[str]:
    lines = (ROOT / "tests" / "slow.txt").read_text().splitlines()
    return [line.split("#", 1)[0].strip() for line in lines if line.split("#", 1)[0].strip()]


def test_every_line_of_the_slow_listing_names_a_test_that_exists():
    for entry in _listed():
        path, _, name = entry.partition("::")
        assert (ROOT / path).is_file(), entry
        if name:
            assert re.search(rf"^\s*def {re.escape(name.split('[')[0])}\(", (ROOT / path).read_text(), re.MULTILINE), entry


def test_make_test_is_the_fast_tier_and_make_test_all_and_ci_run_everything():
    makefile = (ROOT / "Makefile").read_text()
    test = makefile.split("\ntest: $(STAMP)\n", 1)[1].split("\n\n")[0]
    assert '-m "not gpu and (not slow or e2e)"' in test
    # in two workers, a file in one (its module's server or browser started once)
    assert "-n $(TEST_WORKERS) --dist loadgroup" in test and "\nTEST_WORKERS ?= 2\n" in makefile
    import tomllib

    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    assert any(req.startswith("pytest-xdist") for req in dev)
    assert re.search(r"^pytest-xdist==", (ROOT / "constraints.txt").read_text(), re.MULTILINE)
    everything = makefile.split("\ntest-all: $(STAMP)\n", 1)[1].split("\n\n")[0]
    assert everything.strip() == "$(BIN)/python -m pytest $(PYTEST_ARGS)"  # pyproject's addopts: not gpu
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1] == "make test-all"


def test_the_fast_tier_keeps_one_end_to_end_run_of_each_trainer_and_leaves_the_listed_out():
    files = ["tests/trainers/test_synthetic.py", "tests/trainers/test_physical.py", "tests/test_tags.py"]
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "not gpu and (not slow or e2e)",
                           *files], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    fast = [line for line in done.stdout.splitlines() if "::" in line]
    kept = [t for t in fast if t.startswith(tuple(files[:2]))]
    assert kept == ["tests/trainers/test_synthetic.py::test_quick_test_with_memory_monitoring",
                    "tests/trainers/test_physical.py::test_quick_test_recovers_viscosity_with_monitoring"]
    assert any(t.startswith("tests/test_tags.py::") for t in fast)  # not listed: in the fast tier
    left_out = re.search(r"(\d+) deselected", done.stdout)
    assert left_out and int(left_out[1]) > 6  # the trainers' other tests: slow tier
