"""Shared fixtures for every test package."""

from __future__ import annotations

import logging

import pytest

from tbmem._internal._log import forget_reports


@pytest.fixture(autouse=True)
def _fresh_reports():
    """Each test sees "report once" warnings afresh."""
    forget_reports()
    yield
    forget_reports()


@pytest.fixture
def tbmem_log(caplog):
    """Capture the tbmem logger at WARNING."""
    caplog.set_level(logging.WARNING, logger="tbmem")
    return caplog


@pytest.fixture(scope="session")
def demo_logdir(tmp_path_factory):
    """``runs/`` as ``make demo`` writes it (both trainers), once per session (about 30 s)."""
    from tests._demo import write_demo_logdir

    return write_demo_logdir(tmp_path_factory.mktemp("demo"))


@pytest.fixture(scope="session")
def spiked_logdir(tmp_path_factory):
    """``runs/spiked``: a SyntheticTrainer run whose loss spikes at tests._spiked_run.SPIKE_STEP, and
    ``runs/clean``: the same run without the spike (about 15 s for both)."""
    from tests._spiked_run import write_spiked_logdir

    return write_spiked_logdir(tmp_path_factory.mktemp("spiked"))


@pytest.fixture(scope="session")
def compare_logdir(tmp_path_factory):
    """``runs/compare/{heat,burgers,unet_f8,unet_f16}``: tests/_compare_runs.py's four runs (about 50 s)."""
    from tests._compare_runs import write_compare_runs

    return write_compare_runs(tmp_path_factory.mktemp("compare"))


@pytest.fixture(autouse=True)
def _no_columns(monkeypatch):
    """`tbmem report` fits COLUMNS when set: tests that read its tables set it themselves."""
    monkeypatch.delenv("COLUMNS", raising=False)


# --- test tiers (tests/slow.txt): `make test` runs the fast tier and the e2e runs, `make test-all` all ---
def _slow_prefixes() -> list[str]:
    from pathlib import Path

    listing = Path(__file__).with_name("slow.txt").read_text()
    return [line.split("#", 1)[0].strip() for line in listing.splitlines() if line.split("#", 1)[0].strip()]


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """Mark the tests tests/slow.txt lists ``slow`` (a line: a test file, or a test's node id or its prefix)."""
    prefixes = tuple(_slow_prefixes())
    grouped = config.pluginmanager.hasplugin("xdist")
    for item in items:
        if item.nodeid.startswith(prefixes) and not item.get_closest_marker("e2e"):
            item.add_marker(pytest.mark.slow)
        if grouped:  # make test's workers (--dist loadgroup): a file in one, so its module fixtures start once
            path = item.nodeid.split("::", 1)[0]
            item.add_marker(pytest.mark.xdist_group(_TOGETHER.get(path, path)))
    # The framework tests run last: transformers, Lightning and accelerate keep objects of their runs alive
    # in module-level state, and the census tests count every live tensor of the process exactly.
    items.sort(key=lambda item: item.nodeid.startswith(_LAST))


#: What runs after everything else (a stable sort keeps each group's own order).
_LAST = ("tests/integrations/", "tests/interop/")
#: Files whose tests share a session fixture that takes long to build, in one worker of make test: the plugin
#: tests' logdir and the TensorBoard over it (tests/plugin/conftest.py).
_TOGETHER = {"tests/plugin/test_routes.py": "plugin-logdir", "tests/plugin/test_security.py": "plugin-logdir"}


@pytest.fixture(scope="module")
def browser():
    """Headless Debian chromium for a module's tests (tests/_browser.py: skipped without it, failed in CI)."""
    from tests._browser import chromium

    with chromium() as b:
        yield b
