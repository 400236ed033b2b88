"""A CPU snapshot's page (no allocator segments) says so once, in the summary, and shows no empty allocator box
or reserved chart (it said "no segments" three times, under an empty allocator box). Headless Chromium."""

from __future__ import annotations


from tbmem._internal.snapshot.schema import SnapshotBuilder
from tests.snapshot._page import open_page, write_page


def _cpu_snapshot():
    b = SnapshotBuilder(source="dispatch", device="cpu")
    for i in range(4):
        b.alloc(1024 * (i + 1), category="activation", stack=[("/u/train.py", 9, "step")], time_us=i, addr=4096 * i)
    return b.build(kind="snapshot", step=3)


def test_a_cpu_snapshot_says_no_segments_once_and_hides_the_allocator_box(browser, tmp_path):
    page, _r, errors = open_page(browser, write_page(tmp_path, _cpu_snapshot()))
    text = page.inner_text("body")
    assert text.lower().count("segments") == 1, text
    assert "no allocator segments (a CPU recording" in page.inner_text("#summary")
    assert not page.is_visible("#allocbox") and not page.is_visible("#reserved")
    assert page.is_visible("#timeline")
    assert errors == []
