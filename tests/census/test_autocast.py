"""CPU autocast's weight-cast cache: invisible, so its upper bound is reported as such (issue 12: 14)."""

from __future__ import annotations

import gc

import torch
from torch import nn

from tbmem._internal.census import take_census


def _cacheable_bytes(low_precision_bytes: int) -> int:
    """What CPU autocast may cache: a low-precision copy of each float32 leaf that requires grad, not a view."""
    total = 0
    for obj in gc.get_objects():
        if (type(obj) in (torch.Tensor, nn.Parameter) and obj.device.type == "cpu" and obj.dtype == torch.float32
                and obj.requires_grad and obj.is_leaf and not obj._is_view()):
            total += obj.numel() * low_precision_bytes
    return total


def test_inside_cpu_autocast_the_weight_cache_bound_is_reported() -> None:
    gc.collect()
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 8))
    x = torch.randn(16, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x)
        assert out.dtype == torch.bfloat16
        census = take_census(models=[model], roots=[out])
        bound = _cacheable_bytes(torch.finfo(torch.bfloat16).bits // 8)
    assert bound >= sum(p.numel() * 2 for p in model.parameters())
    assert census.blind_spots["cpu_autocast_cache_max"] == bound
    assert any("autocast" in note for note in census.notes)
    assert "autocast" in census.to_markdown()
    outside = take_census(models=[model])
    assert "cpu_autocast_cache_max" not in outside.blind_spots
