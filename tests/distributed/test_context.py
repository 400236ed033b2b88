"""Which rank a process is, and where its writer puts its run (no process group needed)."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from tbmem import MemoryWriter
from tbmem._internal.ranks import RankInfo, RanksConfig, detect_rank
from tbmem._internal.tags import TAGS, ranks_tag
from tests._events import read_events

RSS = TAGS["ram_rss"].tag


@pytest.mark.parametrize("env,expected", [
    ({}, RankInfo()),
    ({"RANK": "0", "WORLD_SIZE": "1"}, RankInfo()),  # torchrun with one process: a single process
    ({"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0"}, RankInfo(rank=2, world_size=4, local_rank=0, source="env")),
    ({"RANK": "4", "WORLD_SIZE": "4"}, RankInfo()),  # inconsistent: ignored
    ({"RANK": "x", "WORLD_SIZE": "4"}, RankInfo()),
])
def test_detect_rank_from_torchrun_variables(env, expected):
    assert detect_rank(environ=env) == expected


@pytest.fixture
def torchrun_env(monkeypatch):
    def set_rank(rank: int, world: int = 2) -> None:
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(world))
        monkeypatch.setenv("LOCAL_RANK", str(rank))
        for var in ("MASTER_ADDR", "MASTER_PORT"):
            monkeypatch.delenv(var, raising=False)
    return set_rank


def test_writer_picks_the_rank_folder_before_the_process_group_exists(tmp_path, torchrun_env):
    torchrun_env(1)
    assert not dist.is_initialized()
    with MemoryWriter(tmp_path, every=1, census_every=0, snapshot={"steps": [1], "html": False}) as w:
        assert w.log_dir == str(tmp_path / "rank1")
        for step in range(3):
            w.log_memory(step)  # no process group: no collective, nothing waits
    assert [p.name for p in tmp_path.iterdir()] == ["rank1"]
    assert (tmp_path / "rank1" / "plugins" / "tbmem" / "snapshot_rank1_step000000001.json.gz").is_file()
    steps = [e.step for e in read_events(tmp_path / "rank1").Scalars(TAGS["ram_rss"].tag)]
    assert steps == [0, 1, 2]


def test_a_disabled_writer_still_writes_its_own_rank_folder(tmp_path, torchrun_env):
    torchrun_env(1)
    with MemoryWriter(tmp_path, enabled=False) as w:
        w.add_scalar("Loss/train", 0.5, 0)  # the trainers log losses through a disabled writer
    assert [p.name for p in tmp_path.iterdir()] == ["rank1"]


def test_ranks_can_be_switched_off(tmp_path, torchrun_env):
    torchrun_env(1)
    with MemoryWriter(tmp_path, census_every=0, ranks={"enabled": False}) as w:
        assert w.log_dir == str(tmp_path)


def test_a_single_process_group_changes_nothing(tmp_path):
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        assert detect_rank() == RankInfo(rank=0, world_size=1, source="dist")
        with MemoryWriter(tmp_path, census_every=0) as w:
            assert w.log_dir == str(tmp_path)
            w.log_memory(0)
    finally:
        dist.destroy_process_group()


def test_rank0_writes_the_margin_charts_only(tmp_path, torchrun_env):
    from tensorboard.backend.event_processing import event_file_loader
    from tensorboard.plugins.custom_scalar import layout_pb2

    def titles(run) -> set[str]:  # noqa: ANN001
        out = set()
        for path in run.glob("events.out.tfevents.*"):
            for event in event_file_loader.EventFileLoader(str(path)).Load():
                for value in event.summary.value:
                    if value.tag == "custom_scalars__config__":
                        layout = layout_pb2.Layout.FromString(value.tensor.string_val[0])
                        out |= {cat.title for cat in layout.category}
        return out

    # the layout follows what a rank writes (tbmem._internal.layout): rank 0 writes the aggregates, so only its
    # layout gets their margin charts (tests/distributed/test_torchrun.py checks a real job's)
    for rank in (0, 1):
        torchrun_env(rank)
        with MemoryWriter(tmp_path, census_every=0) as writer:
            if rank == 0:
                writer.write_scalars({ranks_tag(s, RSS): 1.0 for s in ("mean", "min", "max", "argmax")}, 0)
            writer.write_scalars({RSS: 1.0}, 0)
    assert "tbmem: ranks" in titles(tmp_path / "rank0")
    assert "tbmem: ranks" not in titles(tmp_path / "rank1") and titles(tmp_path / "rank1")


@pytest.mark.parametrize("kwargs,match", [
    ({"tags": ("ram_rss", "census_category")}, "unknown reading 'census_category'"),
    ({"tags": "ram_rss"}, "must be a list"),
    ({"timeout_s": 0}, "timeout_s must be a number of seconds >= 1"),
    ({"oom_wait_s": -1}, "oom_wait_s"),
    ({"enabled": "yes"}, "enabled must be true or false"),
])
def test_ranks_config_names_the_bad_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RanksConfig(**kwargs)


def test_ranks_config_from_a_mapping_names_unknown_keys():
    message = r"unknown RanksConfig key 'timeout' \(did you mean 'timeout_s'\?\); valid keys: "
    with pytest.raises(ValueError, match=message):
        RanksConfig.from_mapping({"timeout": 3})
    from tbmem._internal.config import MemoryWriterConfig

    assert MemoryWriterConfig(ranks={"timeout_s": 5}).ranks.timeout_s == 5.0
    with pytest.raises(ValueError, match="ranks must be a RanksConfig"):
        MemoryWriterConfig(ranks=5)
