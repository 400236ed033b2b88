"""Both trainers' configs under ``torchrun --standalone`` (gloo on CPU, real subprocesses)."""

from __future__ import annotations

import json
from pathlib import Path

from tbmem._internal.tags import TAGS, ranks_tag
from tests._events import read_events
from tests.distributed._torchrun import ROOT, torchrun


def _tags(run: Path) -> list[str]:
    return read_events(run).Tags()["scalars"]


def _only_run_dir(runs: Path, experiment: str) -> Path:
    (run_dir,) = (runs / experiment).iterdir()  # one Hydra run directory for the whole job
    return run_dir


def test_ddp_ranks_end_with_the_same_weights_and_one_checkpoint(tmp_path):
    proc = torchrun(2, ROOT / "tests" / "trainers" / "_ddp_job.py", str(tmp_path), timeout=420)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    r0, r1 = json.loads(line[len("RESULT "):])
    assert r0["moved"] > 0  # it trained
    assert r0["sha256"] == r1["sha256"]  # DDP kept the replicas identical, bit for bit
    assert r0["steps"] == r1["steps"] > 0  # the sampler gave both ranks as many batches
    assert r0["val"] == r1["val"]  # validation split across ranks, then summed
    assert len(r0["checkpoints"]) == 1 and r1["checkpoints"] == []  # rank 0 alone saves
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["rank0", "rank1"]


def test_synthetic_config_under_torchrun(tmp_path):
    proc = torchrun(2, ROOT / "run.py", "--config-name=burgers_quick_test", "trainer=synthetic_with_memory",
                    f"runs_dir={tmp_path / 'runs'}", f"data.cache_dir={tmp_path / 'cache'}", "data.progress=false",
                    "trainer_params.progress=false", "trainer_params.epochs=2", "data.num_frames=12",
                    "data.num_sims=4", "trainer_params.train_sim=[0,1,2]", "trainer_params.val_sim=[3]",
                    "trainer_params.batch_size=4", "tbmem.every=1", "tbmem.census_every=0",
                    "tbmem.snapshot.every=0", timeout=420)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    run_dir = _only_run_dir(tmp_path / "runs", "burgers_quick_test")
    assert {p.name for p in run_dir.iterdir()} >= {"rank0", "rank1", ".hydra", "run.log", "run_rank1.log"}
    assert (run_dir / "rank1" / ".hydra" / "config.yaml").is_file()
    assert list((run_dir / "rank0" / "checkpoints").iterdir()) and not (run_dir / "rank1" / "checkpoints").exists()
    rss = TAGS["ram_rss"].tag
    for r in (0, 1):
        assert {rss, TAGS["ram_tree_rss"].tag, "Loss/train", "Loss/val"} <= set(_tags(run_dir / f"rank{r}"))
    assert ranks_tag("max", rss) in _tags(run_dir / "rank0")
    assert not [t for t in _tags(run_dir / "rank1") if t.startswith("Ranks/")]
    val = [[e.value for e in read_events(run_dir / f"rank{r}").Scalars("Loss/val")] for r in (0, 1)]
    assert val[0] == val[1] and len(val[0]) == 2
    assert proc.stdout.count("View the run with") == 1  # rank 0 prints it


def test_physical_config_under_torchrun(tmp_path):
    proc = torchrun(2, ROOT / "run.py", "--config-name=burgers_physical_quick_test", "trainer=physical_with_memory",
                    f"runs_dir={tmp_path / 'runs'}", f"data.cache_dir={tmp_path / 'cache'}", "data.progress=false",
                    "trainer_params.progress=false", "trainer_params.max_iterations=3", "tbmem.snapshot.every=0",
                    timeout=420)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    run_dir = _only_run_dir(tmp_path / "runs", "burgers_physical_quick_test")
    steps = [sorted(e.step for e in read_events(run_dir / f"rank{r}").Scalars(TAGS["ram_rss"].tag)) for r in (0, 1)]
    assert steps[0] == steps[1] and steps[0]  # one record per loss evaluation on each rank
    agg = sorted(e.step for e in read_events(run_dir / "rank0").Scalars(ranks_tag("mean", TAGS["ram_rss"].tag)))
    assert agg == steps[0]


def test_job_run_name_first_rank_wins_through_the_store():
    import torch.distributed as dist

    from trainers.distributed import job_run_name

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    env = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(server.port),
           "TORCHELASTIC_RUN_ID": "test"}
    assert job_run_name("2026-01-01_00-00-01", environ={**env, "RANK": "1"}) == "2026-01-01_00-00-01"
    later = job_run_name("2026-01-01_00-00-02", environ={**env, "RANK": "0"})  # a later rank
    assert later == "2026-01-01_00-00-01"
    assert job_run_name("alone", environ={}) == "alone"  # a single process keeps its own


def test_job_run_name_without_a_store_is_the_launchers_start_time():
    import os
    import time

    import psutil

    from trainers.distributed import job_run_name

    expected = time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(psutil.Process(os.getppid()).create_time()))
    assert job_run_name("mine", environ={"WORLD_SIZE": "2", "RANK": "1"}) == expected


def test_prepare_hydra_keeps_ranks_out_of_each_others_files():
    from trainers.distributed import prepare_hydra

    assert prepare_hydra(environ={}) == []  # a single process: nothing changes
    assert prepare_hydra(environ={"WORLD_SIZE": "2", "RANK": "0"}) == []
    overrides = prepare_hydra(environ={"WORLD_SIZE": "2", "RANK": "1"})
    assert overrides == ["hydra.output_subdir=rank1/.hydra",
                         "hydra.job_logging.handlers.file.filename=${hydra.runtime.output_dir}/run_rank1.log"]
    # torchrun's variables are read as tbmem reads them: without a valid RANK there is no job
    assert prepare_hydra(environ={"WORLD_SIZE": "2"}) == []
    assert prepare_hydra(environ={"WORLD_SIZE": "2", "RANK": "2"}) == []


def test_base_config_takes_the_agreed_run_name_unless_one_is_given(compose, monkeypatch):
    from omegaconf import OmegaConf

    from trainers.distributed import RUN_NAME_VAR

    monkeypatch.setenv(RUN_NAME_VAR, "agreed")
    assert OmegaConf.select(compose("burgers_quick_test"), "run_name") == "agreed"
    assert OmegaConf.select(compose("burgers_quick_test", "run_name=mine"), "run_name") == "mine"
    monkeypatch.delenv(RUN_NAME_VAR)
    assert OmegaConf.select(compose("burgers_quick_test"), "run_name")[:2] == "20"  # a timestamp
