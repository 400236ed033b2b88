"""The explanation where a user looks: the top of the snapshot page (real Chromium)."""

from __future__ import annotations

import pytest

from tbmem._internal.snapshot.readers import load_snapshot
from tests._browser import chromium
from tests.oom.test_explain_real import H200
from tests.snapshot._page import open_page, write_page


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


def test_snapshot_page_top_explains_the_oom(browser, tmp_path):
    path = write_page(tmp_path, load_snapshot(H200))
    page, requests, errors = open_page(browser, path)
    top = page.inner_text("#summary")
    assert "OUT OF MEMORY" in top
    assert "why cuda:0 ran out of memory: the device was full: 559.2 GiB requested, 139.0 GiB free" in top
    assert "largest free block 12.0 MiB of 12.0 MiB free: large default pool, stream 0" in top
    assert "expandable_segments False" in top and "advice: the request alone (559.2 GiB)" in top
    assert requests == [] and errors == []


def test_snapshot_page_data_carries_the_explanation_of_each_oom():
    from tbmem._internal.snapshot.viewer import render_html

    html = render_html(load_snapshot(H200))
    assert '"why":"tbmem: why cuda:0 ran out of memory: the device was full: 559.2 GiB requested' in html
