"""Memory only C++ holds (issue 26, item 2): TorchScript modules, quantized packed weights, DDP's buckets.

Counted where torch lets Python reach it, named with its bytes where it does not; never silence.
Expected bytes come from the objects each test builds.
"""

from __future__ import annotations

import gc
import io
import warnings

import pytest
import torch
from torch import nn

from tbmem._internal.census import take_census


def _storage_bytes(tensors: list[torch.Tensor]) -> int:
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())


def _jit_loaded(module: nn.Module) -> torch.jit.ScriptModule:
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit is deprecated, and in use
        torch.jit.save(torch.jit.script(module), buffer)
        buffer.seek(0)
        return torch.jit.load(buffer)


def test_a_jit_loaded_module_nobody_handed_over_is_counted() -> None:
    loaded = _jit_loaded(nn.Sequential(nn.Linear(64, 128), nn.BatchNorm1d(128), nn.Linear(128, 256)))
    gc.collect()
    census = take_census()
    params = [p for _, p in loaded.named_parameters()]
    buffers = [b for _, b in loaded.named_buffers()]
    by_name = {}
    for r in census.records:
        if r.name.startswith("torchscript Sequential."):
            by_name.setdefault(r.category, 0)
            by_name[r.category] += r.bytes
    assert by_name == {"parameters": _storage_bytes(params), "buffers": _storage_bytes(buffers)}
    assert by_name["parameters"] == (64 * 128 + 128 + 128 * 2 + 128 * 256 + 256) * 4
    named = take_census(models=[loaded])  # handed over: its own names, the same bytes
    assert named.by_category["parameters"] >= by_name["parameters"]
    assert not [r for r in named.records if r.name.startswith("torchscript")]


def test_quantize_dynamic_linears_count_their_int8_weights() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization is deprecated, and in use
        model = torch.ao.quantization.quantize_dynamic(nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16)),
                                                       {nn.Linear}, dtype=torch.qint8)
    gc.collect()
    expected = 0
    for layer in (model[0], model[2]):
        weight, bias = layer._packed_params._weight_bias()
        assert weight.dtype == torch.qint8
        expected += weight.numel() * weight.element_size() + bias.untyped_storage().nbytes()
    census = take_census()
    counted = sum(r.bytes for r in census.records if r.name.startswith("LinearPackedParams."))
    assert counted == expected == 64 * 32 + 32 * 4 + 32 * 16 + 16 * 4
    assert {r.category for r in census.records if r.name.startswith("LinearPackedParams.")} == {"parameters"}



@pytest.mark.parametrize("as_view", [False, True])
def test_ddp_gradient_buckets_are_named_with_their_bytes(gloo_world_of_one, as_view) -> None:
    net = nn.Sequential(nn.Linear(40, 200), nn.ReLU(), nn.Linear(200, 8))
    ddp = nn.parallel.DistributedDataParallel(net, gradient_as_bucket_view=as_view)
    bucket_bytes = sum(p.numel() * p.element_size() for p in net.parameters())
    assert take_census().blind_spots.get("ddp_gradient_buckets") == bucket_bytes  # before backward: unseen
    ddp(torch.randn(4, 40)).sum().backward()
    census = take_census(models=[ddp])
    grads = _storage_bytes([p.grad for p in net.parameters()])
    if as_view:  # the gradients view the buckets: counted, nothing unseen
        assert "ddp_gradient_buckets" not in census.blind_spots and census.by_category["gradients"] == grads
    else:  # the buckets are copies the reducer holds
        assert census.blind_spots["ddp_gradient_buckets"] == bucket_bytes == grads
        assert "DistributedDataParallel" in census.blind_spot_notes["ddp_gradient_buckets"]
