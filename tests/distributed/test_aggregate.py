"""The aggregates rank 0 computes from one record's gathered rows."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tbmem._internal.layout import custom_scalars_layout
from tbmem._internal.ranks.aggregate import aggregate_rows
from tbmem._internal.tags import TAGS, GiB, ranks_tag

RSS = TAGS["ram_rss"].tag
ALLOC = TAGS["vram_allocated"].tag
STEP = TAGS["step_time"].tag


def test_max_min_mean_argmax_in_the_tags_units():
    rows = np.array([[7, 1 * GiB, 0.020], [7, 4 * GiB, 0.030], [7, 2 * GiB, 0.010]])
    values, reporting = aggregate_rows(rows, ("ram_rss", "step_time"))
    assert reporting == 3
    assert values[ranks_tag("max", RSS)] == 4.0 and values[ranks_tag("argmax", RSS)] == 1.0
    assert values[ranks_tag("min", RSS)] == 1.0
    assert values[ranks_tag("mean", RSS)] == pytest.approx(7 / 3)
    assert values[ranks_tag("max", STEP)] == pytest.approx(30.0)  # ms
    assert values[ranks_tag("argmax", STEP)] == 1.0


def test_ranks_without_a_value_are_left_out_not_counted_as_zero():
    rows = np.array([[3, math.nan, math.nan], [3, 2 * GiB, math.nan], [3, 1 * GiB, math.nan]])
    values, reporting = aggregate_rows(rows, ("ram_rss", "vram_allocated"))
    assert reporting == 2  # rank 0 sent nothing (its probes are off)
    assert values[ranks_tag("mean", RSS)] == 1.5 and values[ranks_tag("argmax", RSS)] == 1.0
    assert not any(ALLOC in tag for tag in values)  # no rank has CUDA: no VRAM aggregate at all


def test_a_tie_names_the_lowest_rank():
    rows = np.array([[0, 1.0 * GiB], [0, 3.0 * GiB], [0, 3.0 * GiB]])
    values, _ = aggregate_rows(rows, ("ram_rss",))
    assert values[ranks_tag("argmax", RSS)] == 1.0


def test_thousand_ranks_in_one_pass():
    rng = np.random.default_rng(0)
    rows = np.column_stack([np.full(1000, 5.0), rng.uniform(1, 2, 1000) * GiB])
    rows[613, 1] = 3 * GiB
    values, reporting = aggregate_rows(rows, ("ram_rss",))
    assert reporting == 1000 and values[ranks_tag("argmax", RSS)] == 613.0


def test_margin_charts_pair_mean_with_min_and_max():
    charts = custom_scalars_layout(rank_tags=("ram_rss", "vram_peak_allocated"))["tbmem: ranks"]
    margins = {t: c[1] for t, c in charts.items() if c[0] == "Margin"}
    assert margins["Peak VRAM allocated across ranks (GB): mean, min..max"] == [
        ranks_tag(s, TAGS["vram_peak_allocated"].tag) for s in ("mean", "min", "max")]
    # one reading per chart, unsmoothed (a margin chart whose band is its line)
    assert charts["Rank holding the maximum Process RSS (rank)"] == ["Margin", [ranks_tag("argmax", RSS)] * 3]
    assert charts["Rank holding the maximum Peak VRAM allocated (rank)"] == [
        "Margin", [ranks_tag("argmax", TAGS["vram_peak_allocated"].tag)] * 3]
    assert "tbmem: ranks" not in custom_scalars_layout()


def test_ranks_tag_keeps_the_tag_whole():
    assert ranks_tag("argmax", "Memory/GPU/vram_peak_allocated_GB") == "Ranks/Memory/GPU/vram_peak_allocated_GB/argmax"
    with pytest.raises(ValueError, match="stat must be one of"):
        ranks_tag("median", RSS)


class _NeverDone:
    """A gather whose peers never come."""

    def is_completed(self) -> bool:
        return False

    def wait(self) -> None:  # pragma: no cover - never reached
        raise AssertionError("waited on a gather that cannot complete")


def _support_with_open_gather():  # noqa: ANN202
    from tbmem._internal.config import MemoryWriterConfig
    from tbmem._internal.ranks.aggregate import _Open
    from tbmem._internal.ranks.context import RankInfo
    from tbmem._internal.ranks.support import RankSupport

    support = RankSupport(RankInfo(rank=0, world_size=2, source="dist"), MemoryWriterConfig(ranks={"timeout_s": 1}))
    support.aggregator._open = _Open(10, None, None, _NeverDone())
    return support


def test_closing_while_an_exception_unwinds_does_not_wait_for_the_peers(tbmem_log):
    import time

    support = _support_with_open_gather()
    start = time.monotonic()
    try:
        raise RuntimeError("the training step failed")
    except RuntimeError:
        support.close()  # e.g. a with-block exiting on the error: the peers may never come
    assert time.monotonic() - start < 0.5
    assert "did not complete" not in tbmem_log.text


def test_closing_normally_waits_at_most_the_timeout_then_goes_on(tbmem_log):
    support = _support_with_open_gather()
    support.close()  # timeout_s=1: gives up after a second, reports once
    assert support.aggregator.off
    assert "the cross-rank gather of step 10 did not complete: no answer within 1 s" in tbmem_log.text
