"""DTensor (FSDP2) parameters, gradients and optimizer state: each rank counts its local shards (issue 13).

On a real gloo process group: one process with world size 1, then two processes, each holding half
of every parameter.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch
import torch.distributed as dist
from torch import nn

from tbmem._internal.census import take_census
from tests.census._model import tensors_in

pytestmark = pytest.mark.skipif(not dist.is_available() or sys.platform == "win32",
                                reason="needs torch.distributed with gloo")


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def _spans(tensors: Iterator[torch.Tensor]) -> dict[int, int]:
    out = {}
    for t in tensors:
        s = _local(t).untyped_storage()
        if s.nbytes():
            out[s.data_ptr()] = s.nbytes()
    return out


def _train_and_measure(world_size: int) -> dict[str, Any]:
    """Build an FSDP2 model on the current group, take one Adam step, and compare the census with the shards."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16))
    fully_shard(model, mesh=init_device_mesh("cpu", (world_size,)))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(8, 32)).square().mean().backward()
    opt.step()
    params = list(model.parameters())
    assert all(type(p) is DTensor and type(p.grad) is DTensor for p in params)
    param_spans = _spans(iter(params))
    grad_spans = _spans(p.grad for p in params)
    state_spans = {k: v for k, v in _spans(tensors_in(dict(opt.state))).items()
                   if k not in param_spans and k not in grad_spans}
    watched = take_census(models=[model], optimizers=[opt])
    unwatched = take_census()
    return {
        "expected": {"parameters": sum(param_spans.values()), "gradients": sum(grad_spans.values()),
                     "optimizer_state": sum(state_spans.values())},
        "watched": {k: watched.by_category[k] for k in ("parameters", "gradients", "optimizer_state")},
        # not watched, the shards are named after the local variable holding their module (census/names.py)
        "unwatched_dtensor_parameters": sum(r.bytes for r in unwatched.records
                                            if r.category == "parameters" and r.name.startswith("model.")),
        "local_numel": sum(_local(p).numel() for p in params),
        "global_numel": sum(p.numel() for p in params),
        "names": sorted(r.name for r in watched.records if r.category == "parameters"),
        "notes": watched.notes,
    }


def _check(result: dict[str, Any], world_size: int) -> None:
    assert result["watched"] == result["expected"], result
    assert result["expected"]["parameters"] >= result["local_numel"] * 4 > 0
    assert result["local_numel"] * world_size == result["global_numel"]
    assert result["unwatched_dtensor_parameters"] == result["expected"]["parameters"]
    assert result["names"] == ["model.0.bias", "model.0.weight", "model.2.bias", "model.2.weight"]
    assert result["notes"] == []



def test_fsdp2_shards_in_a_world_of_one(gloo_world_of_one) -> None:
    _check(_train_and_measure(1), 1)


def _rank_main(rank: int, world_size: int, store_path: str, out_dir: str) -> None:
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    try:
        result = _train_and_measure(world_size)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))


def test_fsdp2_shards_on_two_ranks(tmp_path) -> None:
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank_main, args=(r, 2, str(tmp_path / "store"), str(tmp_path))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(180)
    for p in procs:
        if p.is_alive():
            p.kill()
    assert [p.exitcode for p in procs] == [0, 0]
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for result in results:
        _check(result, 2)
