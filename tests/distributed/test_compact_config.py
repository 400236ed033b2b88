"""The compact layout's settings: RanksConfig.layout and compact_above, and the trainers' tbmem._internal.ranks node."""

from __future__ import annotations

import os

import pytest

from tbmem._internal.config import MemoryWriterConfig
from tbmem._internal.ranks import RanksConfig
from tbmem._internal.ranks.context import RankInfo
from tbmem._internal.ranks.support import RankSupport


def test_auto_is_compact_above_compact_above_ranks_only():
    cfg = RanksConfig()
    assert (cfg.layout, cfg.compact_above) == ("auto", 64)
    assert [cfg.compact(n) for n in (2, 64, 65, 1000)] == [False, False, True, True]
    assert RanksConfig(layout="per_rank").compact(1000) is False
    assert RanksConfig(layout="compact").compact(2) is True
    assert RanksConfig(compact_above=8).compact(9) is True


@pytest.mark.parametrize("values, message", [
    ({"layout": "wide"}, "RanksConfig.layout must be one of auto, per_rank, compact, got 'wide'"),
    ({"compact_above": 0}, "RanksConfig.compact_above must be a whole number of ranks >= 1, got 0"),
    ({"compact_above": True}, "RanksConfig.compact_above must be a whole number of ranks >= 1, got True"),
])
def test_bad_settings_are_named(values, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        RanksConfig.from_mapping(values)


def test_the_trainers_tbmem_ranks_layout_reaches_the_writer():
    from trainers.config import _tbmem_config

    cfg = _tbmem_config({"every": 10, "ranks": {"layout": "compact"}})
    assert isinstance(cfg, MemoryWriterConfig) and cfg.ranks.layout == "compact"


def test_a_remote_job_stages_a_rank_locally_and_uploads_the_run_it_keeps(tmp_path):
    fsspec = pytest.importorskip("fsspec", reason="remote logdirs need fsspec (tbmem[remote])")
    support = RankSupport(RankInfo(rank=1, world_size=2, source="env"),
                          MemoryWriterConfig(ranks={"layout": "compact"}))
    staging = support.run_dir("memory://compact-test/job")
    assert support.staged and support.table_sink() is not None
    assert os.path.isdir(staging) and not staging.startswith("memory:")  # written locally, as any run
    with open(os.path.join(staging, "events.out.tfevents.1"), "wb") as f:
        f.write(b"events")
    os.makedirs(os.path.join(staging, "plugins", "tbmem"))
    with open(os.path.join(staging, "plugins", "tbmem", "census.jsonl"), "w") as f:
        f.write("{}\n")
    support._channel.close(wait_s=0.1)  # no local rank 0 here to receive its records
    support._channel = None
    support.keep.add("a test")
    store = fsspec.filesystem("memory")
    try:
        assert support.finish() == "memory://compact-test/job/rank1"
        assert store.cat("/compact-test/job/rank1/events.out.tfevents.1") == b"events"
        assert store.cat("/compact-test/job/rank1/plugins/tbmem/census.jsonl") == b"{}\n"
        assert not os.path.exists(staging)
    finally:
        support.close()
        if store.exists("/compact-test"):
            store.rm("/compact-test", recursive=True)


def test_auto_without_pyarrow_falls_back_to_per_rank_with_one_message(monkeypatch, caplog):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pyarrow" else real(name, *a))
    big = RankInfo(rank=1, world_size=128, source="env")
    support = RankSupport(big, MemoryWriterConfig())
    assert support.compact is False and support.run_dir("runs/job") == "runs/job/rank1"
    assert "needs pyarrow (pip install 'tbmem[ranks]'); every rank writes its own run instead" in caplog.text
    support.close()
    asked = RankSupport(big, MemoryWriterConfig(ranks={"layout": "compact"}))
    assert asked.compact is True  # asked for: kept (the writer then names the missing extra)
    asked.close()
