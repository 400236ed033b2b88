"""A real `tensorboard` server on 127.0.0.1 shows what MemoryWriter wrote."""

import json
import urllib.request

import pytest

from tbmem import MemoryWriter
from tbmem._internal.tags import TAGS
from tests._servers import Server


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read()


@pytest.fixture
def tensorboard(tmp_path):
    logdir = tmp_path / "runs"
    with MemoryWriter(logdir / "run_a", every=1, census_every=0) as writer:
        for step in range(3):
            writer.add_scalar("Loss/train", 1.0 / (step + 1), step)
            writer.log_memory(step)
    with Server(tmp_path, "--logdir", str(logdir), "--load_fast", "false", wait_run="run_a") as srv:
        yield srv.base


def test_tensorboard_serves_memory_scalars_and_layout(tensorboard):
    tags = json.loads(_get(f"{tensorboard}/data/plugin/scalars/tags"))["run_a"]
    assert TAGS["ram_rss"].tag in tags and "Loss/train" in tags
    rss = json.loads(_get(f"{tensorboard}/data/plugin/scalars/scalars?run=run_a&tag={TAGS['ram_rss'].tag}"))
    assert [point[1] for point in rss] == [0, 1, 2]
    assert all(0 < point[2] < 1024 for point in rss)  # GB
    layout = json.loads(_get(f"{tensorboard}/data/plugin/custom_scalars/layout"))
    categories = [cat["title"] for cat in layout["category"]]
    assert categories[0] == "tbmem: memory" and not [c for c in categories if "GPU" in c]  # CPU run
    titles = [c["title"] for cat in layout["category"] for c in cat["chart"]]
    assert "Process RSS (GB)" in titles
    assert "Step time, mean since the previous record (ms)" in titles  # the layout written at step 1 wins
