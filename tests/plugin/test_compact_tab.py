"""The Memory tab on a compact job (docs/distributed.md): every rank's peaks, the rank x step heat map
of VRAM and a rank's drill-down, from the job's Parquet rank tables, through a real tensorboard and
headless Chromium. The job is benchmarks/synthetic_ranks.py's (64 ranks x 200 records)."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("pyarrow", reason="the compact layout needs pyarrow (tbmem[ranks])")

from benchmarks.synthetic_ranks import HOT_RANK, build  # noqa: E402
from tbmem._internal.logdir.rank_table import read_rank_table  # noqa: E402
from tests._browser import frame, wait_until  # noqa: E402
from tests.plugin._logdir import Server, get  # noqa: E402

RANKS, RECORDS = 64, 200
VRAM = "Memory/GPU/vram_allocated_GB"


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("compact_tab")
    build(str(logdir), RANKS, RECORDS)
    srv = Server(tmp_path_factory.mktemp("tb"), "--logdir", str(logdir), "--load_fast", "false", wait_run="rank0")
    yield logdir, srv
    srv.stop()


def _get(srv, route):
    status, body, _ = get(f"{srv.base}/data/plugin/tbmem/{route}")
    assert status == 200, body[:500]
    return json.loads(body)


def test_routes_give_every_rank_s_peak_and_the_heat_map_from_the_tables(job):
    logdir, srv = job
    table = read_rank_table(str(logdir / "job")).to_pandas()
    # the tab's peak: the peak tag first
    peaks = table.groupby("rank")["Memory/GPU/vram_peak_allocated_GB"].max() * 2**30
    doc = _get(srv, "ranks?group=job")
    assert doc["compact"] is True and [r["rank"] for r in doc["ranks"]] == list(range(RANKS))
    assert [r["peak_vram_allocated"] for r in doc["ranks"]] == pytest.approx(peaks.tolist(), rel=1e-9)
    assert max(doc["ranks"], key=lambda r: r["peak_vram_allocated"])["rank"] == HOT_RANK(RANKS)
    assert doc["ranks"][0]["run"] == "job/rank0" and doc["ranks"][1]["run"] is None
    heat = _get(srv, "heatmap?group=job&columns=50")
    assert heat["tag"] == VRAM and heat["ranks"] == list(range(RANKS)) and len(heat["steps"]) == 50
    grid = np.array(heat["values"])
    # each bin is the highest of 4 consecutive records: the hot rank's 2 GB show from the middle on
    expect = table.pivot(index="rank", columns="step", values=VRAM).to_numpy().reshape(RANKS, 50, 4).max(axis=2)
    assert grid == pytest.approx(expect * 2**30, rel=1e-9)
    one = _get(srv, f"rank_series?group=job&rank={HOT_RANK(RANKS)}")["series"][VRAM]
    assert len(one["steps"]) == RECORDS and one["values"][-1] - one["values"][0] > 2 * 2**30
    status, _, _ = get(f"{srv.base}/data/plugin/tbmem/heatmap?group=nothing")
    assert status == 404


def test_tab_draws_the_heat_map_and_drills_into_a_rank(job, browser, tmp_path):
    logdir, srv = job
    context = browser.new_context(viewport={"width": 1400, "height": 1400})
    errors: list[str] = []
    page = context.new_page()
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{srv.base}/#tbmem")
    tab = frame(page, "plugin_entry.html")
    tab.wait_for_selector("#heatmap", timeout=60_000)
    wait_until(tab, "() => document.querySelector('#drill-chart canvas')")
    size = tab.evaluate("() => { const c = document.getElementById('heatmap'); return [c.width, c.height]; }")
    assert size == [200, RANKS]  # one pixel per rank and step bin, scaled by CSS
    # the hot rank's row is the brightest at the right end: yellow, where the others are blue-green
    right = tab.evaluate("""() => { const c = document.getElementById('heatmap'); const d = c.getContext('2d')
        .getImageData(c.width - 1, 0, 1, c.height).data; const out = []; for (let i = 0; i < d.length; i += 4)
        out.push(d[i] + d[i + 1]); return out; }""")
    assert int(np.argmax(right)) == HOT_RANK(RANKS)
    assert tab.locator("#drill-title").inner_text().startswith(f"rank {HOT_RANK(RANKS)}:")
    # a click on rank 10's row drills into rank 10 (a rank without a TensorBoard run)
    box = tab.locator("#heatmap").bounding_box()
    tab.locator("#heatmap").click(position={"x": box["width"] / 2, "y": (10.5 / RANKS) * box["height"]})
    wait_until(tab, "() => document.getElementById('drill-title').textContent.startsWith('rank 10:')")
    rows = tab.locator(".ranks-table tbody tr").all_inner_texts()
    assert len(rows) == 20 and rows[0].startswith(f"rank {HOT_RANK(RANKS)}")
    tab.locator("#ranks-box").screenshot(path=str(tmp_path / "compact_tab.png"))
    assert errors == []
    context.close()
