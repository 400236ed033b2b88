"""The documented TensorBoard flags keep every point in every tab: a real ``tensorboard`` on 127.0.0.1, with
the ``--samples_per_plugin`` value docs/plugin.md gives, serves all of a run's records in the Scalars and
Time Series routes, with both of TensorBoard's loaders (its Rust data server and the Python one)."""

from __future__ import annotations

import json
import re
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tbmem import MemoryWriter
from tbmem._internal.tags import TAGS
from tests._servers import Server

DOCS = Path(__file__).resolve().parents[2] / "docs" / "plugin.md"
RECORDS = 1500  # more than TensorBoard's default of 1000 per tag


def _documented_flag() -> str:
    found = re.findall(r"`--samples_per_plugin[ =]([^`\s]+)`", DOCS.read_text(encoding="utf-8"))
    assert found, "docs/plugin.md names no --samples_per_plugin value"
    assert len(set(found)) == 1, found  # one advice
    return found[0]


def _get(url: str, data: bytes | None = None) -> bytes:
    with urllib.request.urlopen(url, data=data, timeout=10) as response:
        return response.read()


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tb")
    with MemoryWriter(root / "run", every=1, census_every=0) as w:
        for step in range(RECORDS):
            w.add_scalar("Loss/train", 1.0 / (step + 1), step)
            w.log_memory(step)
    return root


@pytest.mark.parametrize("load_fast", ["true", "false"])
def test_documented_flags_keep_every_point_in_scalars_and_time_series(logdir, load_fast, tmp_path):
    flag = _documented_flag()
    rss = TAGS["ram_rss"].tag
    with Server(tmp_path, "--logdir", str(logdir), "--load_fast", load_fast, "--samples_per_plugin", flag,
                "--reload_interval", "1", wait_run="run") as srv:
        base, deadline = srv.base, time.monotonic() + 120
        points: list[list[float]] = []
        while len(points) < RECORDS:  # the loader may still be reading the file
            try:
                query = urllib.parse.urlencode({"run": "run", "tag": "Loss/train"})
                points = json.loads(_get(f"{base}/data/plugin/scalars/scalars?{query}"))
            except OSError:
                points = []
            if time.monotonic() > deadline or srv.proc.poll() is not None:
                break
            time.sleep(0.5)
        assert [p[1] for p in points] == list(range(RECORDS)), srv.log.read_text()[-3000:]
        for tag in ("Loss/train", rss):
            query = urllib.parse.urlencode({"run": "run", "tag": tag})
            scalars = json.loads(_get(f"{base}/data/plugin/scalars/scalars?{query}"))
            assert len(scalars) == RECORDS, (tag, len(scalars))
            body = urllib.parse.urlencode({"requests": json.dumps([{"plugin": "scalars", "tag": tag}])}).encode()
            (series,) = json.loads(_get(f"{base}/data/plugin/timeseries/timeSeries", data=body))
            assert [p["step"] for p in series["runToSeries"]["run"]] == list(range(RECORDS)), tag
