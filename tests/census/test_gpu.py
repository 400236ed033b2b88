"""The census on a real CUDA device (deselected by default; ``pytest -m gpu``; see scripts/gpu_check.sh)."""

from __future__ import annotations

import gc

import pytest
import torch

from tbmem import take_census

pytestmark = pytest.mark.gpu


def _storage_bytes(tensors):
    return sum(t.untyped_storage().nbytes() for t in tensors)


def test_every_category_exact_and_unattributed_bounded_on_a_real_device():
    dev = torch.device("cuda", torch.cuda.current_device())
    # cuBLAS takes a workspace from the caching allocator per handle and stream at its first use, and
    # the backward pass runs on autograd's own thread with its own handle: one step of a small model
    # makes both exist before the baseline is read.
    warm = torch.nn.Linear(64, 64).to(dev)
    warm(torch.randn(8, 64, device=dev)).sum().backward()
    del warm
    gc.collect()
    before = torch.cuda.memory_allocated(dev)  # what no tensor of this test holds

    model = torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.BatchNorm1d(2048), torch.nn.ReLU(),
                                torch.nn.Linear(2048, 10)).to(dev)
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(512, 1024, device=dev)
    model(x).sum().backward()
    opt.step()
    census = take_census([model], [opt], full_scan=True)

    assert census.by_category["parameters"] == _storage_bytes(model.parameters())
    assert census.by_category["gradients"] == _storage_bytes(p.grad for p in model.parameters())
    assert census.by_category["buffers"] == _storage_bytes(model.buffers())
    assert census.by_category["optimizer_state"] == _storage_bytes(
        v for s in opt.state.values() for v in s.values() if torch.is_tensor(v))
    stats = torch.cuda.memory_stats(dev)
    on_device = census.by_device[str(dev)]
    assert on_device + census.unattributed_bytes == stats["allocated_bytes.all.current"]
    # What the census cannot attribute: what was allocated before this test's tensors existed (cuBLAS's
    # workspaces, tensors of earlier tests that no Python object reaches) and the caching allocator's
    # rounding of each block to a multiple of 512 bytes (a 40-byte bias takes 512); never a tensor here.
    rounding = sum(-r.bytes % 512 if r.bytes else 512 for r in census.records if r.device == str(dev))
    assert 0 <= census.unattributed_bytes <= before + rounding


def test_activations_of_a_live_graph_on_a_real_device():
    dev = torch.device("cuda", torch.cuda.current_device())
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 16)).to(dev)
    x = torch.randn(256, 1024, device=dev)
    with torch.no_grad():
        without_graph = take_census([model], full_scan=True).by_category["activations"]
    loss = model(x).square().mean()
    census = take_census([model], roots=[loss], full_scan=True)
    # the GELU's input and the second Linear's input (256 x 4096 float32 each) are saved for backward
    assert census.by_category["activations"] - without_graph >= 2 * 256 * 4096 * 4
    loss.backward()
