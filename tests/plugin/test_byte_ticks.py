"""The byte axes of the Memory tab (census, memory lines, compare, ranks): one unit per axis, exact labels,
no two alike. Per tick, ``fmtBytes`` read ``1.46 MiB / 1000.0 KiB / 500.0 KiB`` on one axis (a step of 500 KiB)
and the same label five times on a narrow range. The tab's own util.js and chart.js, in headless Chromium."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests._browser import chromium

STATIC = Path(__file__).resolve().parents[2] / "tbmem" / "_internal" / "plugin" / "static"
KiB, MiB, GiB = 2**10, 2**20, 2**30
UNITS = {"B": 1, "KiB": KiB, "MiB": MiB, "GiB": GiB, "TiB": 2**40}


def _classic(name: str) -> str:
    """A module of the tab as a classic script: its imports dropped, its exports plain declarations."""
    text = (STATIC / name).read_text(encoding="utf-8")
    text = re.sub(r"^import .*$", "", text, flags=re.M)
    return re.sub(r"^export ", "", text, flags=re.M)


@pytest.fixture(scope="module")
def page():
    with chromium() as browser:
        tab = browser.new_page()
        tab.set_content("<html><body></body></html>")
        tab.add_script_tag(content=_classic("util.js") + _classic("chart.js")
                           + "\nwindow.T = { fmtByteTicks, BYTE_INCRS };")
        yield tab


def _labels(page, ticks):
    return page.evaluate("(ticks) => window.T.fmtByteTicks(ticks)", ticks)


def _check(ticks, labels):
    assert len(set(labels)) == len(labels), labels
    units = {label.split()[1] for label in labels}
    assert len(units) == 1, labels
    for tick, label in zip(ticks, labels):
        number, unit = label.split()
        assert float(number) * UNITS[unit] == pytest.approx(tick, abs=1e-9), (tick, label)


def test_an_axis_up_to_a_mebibyte_and_a_half_reads_in_one_unit(page):
    ticks = [0, 512 * KiB, MiB, 1.5 * MiB]
    assert _labels(page, ticks) == ["0.0 MiB", "0.5 MiB", "1.0 MiB", "1.5 MiB"]
    # the steps uPlot may take are powers of two: no 500 KiB step, so no 1000 KiB / 1.46 MiB
    incrs = page.evaluate("window.T.BYTE_INCRS")
    assert 500 * KiB not in incrs and 512 * KiB in incrs


@pytest.mark.parametrize("base", [0, 332 * MiB, 317 * GiB // 1000])
def test_every_step_gives_distinct_exact_labels_in_one_unit(page, base):
    for step in page.evaluate("window.T.BYTE_INCRS")[:45]:
        start = base // step * step
        ticks = [start + i * step for i in range(5)]
        _check(ticks, _labels(page, ticks))


def test_a_narrow_range_of_a_third_of_a_gibibyte(page):
    # RSS flat at ~0.317 GB: five ticks 16 KiB apart read five different, true labels
    ticks = [20_776 * 16 * KiB + i * 16 * KiB for i in range(5)]
    labels = _labels(page, ticks)
    _check(ticks, labels)
    assert labels[0] == "332416 KiB"
