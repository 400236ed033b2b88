"""The tab's routes with the Rust data server (--load_fast=true) and with --logdir_spec."""

from __future__ import annotations

import json
import time

import pytest

from tbmem._internal.tags import TAGS
from tests.plugin._logdir import SPIKE, Server, get, get_json


def _wait_for_census(plugin_url: str, run: str, n: int = 3) -> dict:
    """The Rust server loads in the background: poll until the run's censuses are all there."""
    deadline = time.monotonic() + 90
    while True:
        status, body, _ = get(f"{plugin_url}/overview?run={run}")
        if status == 200:
            doc = json.loads(body)
            if len(doc["census_steps"]) >= n and len(doc["x"]) >= 30:
                return doc
        if time.monotonic() > deadline:
            raise AssertionError(f"overview of {run} never complete: {status} {body[:300]}")
        time.sleep(0.5)


def _check(plugin_url: str, run: str, reference: dict) -> None:
    doc = _wait_for_census(plugin_url, run)
    assert doc["census_steps"] == reference["census_steps"]
    for s in reference["stack"]:
        assert doc["columns"][s["tag"]] == reference["columns"][s["tag"]]
    at = get_json(f"{plugin_url}/at?run={run}&step=20")
    assert at["census"]["source"] == "census.jsonl" and at["census"]["step"] == 20
    snaps = get_json(f"{plugin_url}/snapshots?run={run}")
    real = next(s for s in snaps if s["name"].endswith("rank0_memory_snapshot.pickle"))
    status, body, _ = get(f"{plugin_url}/snapshot?run={run}&id={real['id']}")
    assert status == 200 and b'id="tbmem-data"' in body
    assert get(f"{plugin_url}/snapshot?run={run}&id=../secret")[0] == 404


@pytest.mark.parametrize("mode", ["load_fast", "logdir_spec"])
def test_other_loaders(mode, logdir_paths, plugin_url, tmp_path):
    reference = get_json(f"{plugin_url}/overview?run=train")  # from the --load_fast=false server
    logdir = logdir_paths["logdir"]
    if mode == "load_fast":
        srv = Server(tmp_path, "--logdir", str(logdir), "--load_fast", "true")
        run, group = "train", "exp"
    else:
        spec = f"a:{logdir / 'train'},b:{logdir / 'exp'}"
        srv = Server(tmp_path, "--logdir_spec", spec, wait_run="a/.")
        run, group = "a/.", "b"
    try:
        url = f"{srv.base}/data/plugin/tbmem"
        listing = get_json(f"{srv.base}/data/plugins_listing")
        assert listing["tbmem"]["enabled"] is True
        _check(url, run, reference)
        groups = {g["group"]: g for g in get_json(f"{url}/runs")["groups"]}
        assert [m["rank"] for m in groups[group]["members"]] == [0, 1]
        assert len(get_json(f"{url}/ranks?group={group}")["ranks"]) == 2
        if mode == "load_fast":  # the Rust server samples cheaply: quick draws a sample, then the exact view
            tag = TAGS["ram_rss"].tag
            while len(get_json(f"{srv.base}/data/plugin/scalars/scalars?run=long&tag={tag}")) < 1000:
                time.sleep(0.5)  # loaded (asked through TensorBoard's own route: nothing cached in the plugin)
            quick = get_json(f"{url}/overview?run=long&points=50&quick=1")
            assert tag in quick["sampled"] and quick["records"][tag] == 400
            full = get_json(f"{url}/overview?run=long&points=50")
            assert full["sampled"] == [] and full["records"][tag] == 1000
            assert max(v for v in full["columns"][tag] if v is not None) == SPIKE[1] * 2**30
            assert get_json(f"{url}/overview?run=long&points=50&quick=1")["sampled"] == []  # now cached
        if mode == "logdir_spec":  # the other spec entry's folder is not reachable through this run
            assert get(f"{url}/overview?run=b/../a/.")[0] == 404
    finally:
        srv.stop()
