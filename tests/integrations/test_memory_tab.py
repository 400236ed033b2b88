"""The Memory tab over runs of the three frameworks (real tensorboard, real Chromium): each run's loss panel has
the framework's own loss tag, beside the census the adapter wrote into the same run."""

from __future__ import annotations

import time
import urllib.parse

import pytest

pytest.importorskip("transformers")
pytest.importorskip("lightning")
pytest.importorskip("accelerate")

from tests._browser import chromium, wait_until
from tests.integrations import test_accelerate, test_lightning, test_transformers
from tests.plugin._logdir import Server, get_json

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"), pytest.mark.filterwarnings("ignore::FutureWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]


@pytest.fixture(scope="module")
def tab(tmp_path_factory):
    import lightning.pytorch as pl

    from tbmem.integrations.accelerate import MemoryTracker
    from tbmem.integrations.lightning import MemoryCallback as LitCallback
    from tbmem.integrations.transformers import MemoryCallback

    logdir = tmp_path_factory.mktemp("frameworks")
    test_transformers._train(logdir / "hf", [MemoryCallback(census_every=2, every=1)], steps=8)
    test_lightning._fit(pl, logdir / "lightning", [LitCallback(census_every=2, every=1)], steps=8)
    test_accelerate._loop(logdir / "accelerate", MemoryTracker(logdir / "accelerate" / "run", census_every=2, every=1))
    _own_loss_run(logdir / "own")
    runs = {"train/loss": next(p for p in (logdir / "hf").rglob("census.jsonl")).parents[2],
            "train_loss": logdir / "lightning" / "lit" / "version_0", "loss": logdir / "accelerate" / "run",
            "train/ce_loss": logdir / "own"}
    runs = {tag: str(run.relative_to(logdir)) for tag, run in runs.items()}
    server = Server(tmp_path_factory.mktemp("tb"), "--logdir", str(logdir), "--load_fast", "false",
                    wait_run=runs["loss"])
    yield server, runs
    server.stop()


def _own_loss_run(run) -> None:
    """A run whose loss is its own tag, made a loss by its configuration (TensorBoard's process has no
    TBMEM_LOSS_TAGS: the tab reads the run's settings)."""
    import torch

    from tbmem import MemoryWriter

    net = torch.nn.Linear(8, 8)
    with MemoryWriter(run, every=1, census_every=2, loss_tags=["train/ce_*"]) as w:
        w.watch(net)
        for step in range(6):
            w.add_scalar("train/ce_loss", 1.0 / (step + 1), step)
            w.log_memory(step)


def _overview(server, run):
    url = f"{server.base}/data/plugin/tbmem/overview?run={urllib.parse.quote(run)}&breakdown=category&points=500"
    deadline = time.monotonic() + 90
    while True:
        doc = get_json(url)
        if doc["loss"] and doc["census_steps"] or time.monotonic() > deadline:
            return doc
        time.sleep(1)


@pytest.mark.parametrize("loss", ["train/loss", "train_loss", "loss", "train/ce_loss"])
def test_the_loss_panel_has_the_frameworks_loss(tab, loss, monkeypatch):
    monkeypatch.delenv("TBMEM_LOSS_TAGS", raising=False)
    server, runs = tab
    doc = _overview(server, runs[loss])
    assert [entry["tag"] for entry in doc["loss"]] == [loss]
    assert doc["census_steps"] == [s for s in doc["census_steps"] if s % 2 == 0] and len(doc["census_steps"]) >= 3
    assert not any(v is None for v in doc["columns"][loss])  # the loss on every x of the run


def test_the_memory_tab_on_a_hugging_face_run(tab, tmp_path):
    server, runs = tab
    run = runs["train/loss"]
    with chromium() as browser:
        page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{server.base}/#tbmem")
        frame = None
        deadline = time.monotonic() + 60
        while frame is None and time.monotonic() < deadline:
            frame = next((f for f in page.frames if "plugin_entry.html" in f.url), None)
            page.wait_for_timeout(200)
        assert frame is not None
        frame.wait_for_selector("#chart canvas", timeout=60_000)
        frame.select_option("#run", run)
        wait_until(frame, f"() => window.tbmemMemoryTab && window.tbmemMemoryTab.overview"
                          f" && window.tbmemMemoryTab.overview.run === {run!r}")
        assert frame.evaluate("window.tbmemMemoryTab.overview.loss.map(l => l.tag)") == ["train/loss"]
        # issue 42: a click shows the census; each tensor's name starts with its row of the by-module table
        box = frame.locator("#census-panel .u-over").bounding_box()
        page.mouse.click(box["x"] + box["width"] * 0.95, box["y"] + box["height"] * 0.5)
        frame.wait_for_selector("#at-box:not([hidden]) .top-table")
        modules = [r.split("\t")[0] for r in frame.locator("h3:has-text('by module') + table tbody tr").all_inner_texts()]
        top = [r.split("\t") for r in frame.locator(".top-table tbody tr").all_inner_texts()]
        held = [name for _, name, category, *_ in top if category in ("parameters", "gradients")]
        assert held and set(modules) >= {"model.transformer.wte", "model.transformer.h"}  # depth 2: GPT-2's parts
        for name in held:
            assert any(name.startswith(m + ".") for m in modules), (name, modules)
        page.wait_for_timeout(1000)
        page.screenshot(path=str(tmp_path / "memory-tab-hf.png"), full_page=True)
        print("screenshot:", tmp_path / "memory-tab-hf.png")
        assert errors == []
