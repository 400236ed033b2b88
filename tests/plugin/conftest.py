"""Fixtures of the plugin tests: one logdir for the session, a real tensorboard over it (the browser:
tests/conftest.py's)."""

from __future__ import annotations

import pytest

from tests.plugin._logdir import Server, build_logdir_isolated


@pytest.fixture(scope="session")
def logdir_paths(tmp_path_factory):
    # In a fresh process: the census counts every tensor of the process, and tensors other tests
    # leave alive (an int32 index kept by a cache) would enter the expected breakdowns.
    return build_logdir_isolated(tmp_path_factory.mktemp("plugin"))


@pytest.fixture(scope="session")
def server(logdir_paths, tmp_path_factory):
    """tensorboard --load_fast=false (Python loader) over the session logdir."""
    srv = Server(tmp_path_factory.mktemp("tb"), "--logdir", str(logdir_paths["logdir"]), "--load_fast", "false")
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def plugin_url(server):
    return f"{server.base}/data/plugin/tbmem"
