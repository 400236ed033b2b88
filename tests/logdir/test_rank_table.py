"""tbmem._internal.logdir.rank_table.RankTableWriter: rows and column blocks in one table, every value where it belongs."""

from __future__ import annotations

import pytest

pa = pytest.importorskip("pyarrow", reason="the rank table needs pyarrow (tbmem[ranks])")
np = pytest.importorskip("numpy")

from tbmem._internal.logdir.rank_table import RankTableWriter, rank_table_path, read_rank_table  # noqa: E402


def test_rows_and_blocks_of_different_tags_make_one_table_with_nulls_where_a_record_lacks_a_tag(tmp_path):
    table = RankTableWriter(rank_table_path(str(tmp_path), "0"))
    table.add(0, 0, 1.7e9, {"a": 1.0})  # local rank 0's own record
    table.add_block(1, ("a", "b"), [0, 1], [1.7e9, 1.7e9 + 1], np.array([[2.0, 3.0], [4.0, float("nan")]]))
    table.flush()
    table.add_block(2, ("c",), [5], [1.7e9 + 2], np.array([[6.0]]))  # a new tag in a later row group
    table.close()
    rows = sorted(read_rank_table(str(tmp_path)).to_pylist(), key=lambda r: (r["rank"], r["step"]))
    assert [(r["rank"], r["step"], r["a"], r["c"]) for r in rows] == [
        (0, 0, 1.0, None), (1, 0, 2.0, None), (1, 1, 4.0, None), (2, 5, None, 6.0)]
    assert rows[1]["b"] == 3.0 and np.isnan(rows[2]["b"]) and rows[0]["b"] is None  # NaN kept, absent null
    assert table.rows == 4 and table.row_groups == 2 and table.pending() == 0


def test_a_block_whose_shape_does_not_match_its_tags_is_refused(tmp_path):
    table = RankTableWriter(rank_table_path(str(tmp_path), "0"))
    with pytest.raises(ValueError, match=r"shape \(2, 1\) for 2 records of 2 tags"):
        table.add_block(1, ("a", "b"), [0, 1], [1.0, 2.0], np.zeros((2, 1)))
