"""HybridDataset: windows, sample contents and the LRU cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trainers.dataset import HybridDataset


@pytest.fixture
def folder(tmp_path):
    for i in range(4):
        frames = np.arange(10 * 2 * 8, dtype=np.float32).reshape(10, 2, 8) + 1000 * i
        np.save(tmp_path / f"sim_{i:04d}.npy", frames)
    return tmp_path


def test_sliding_window_samples(folder):
    ds = HybridDataset(folder, [0, 2], num_predict_steps=3, use_sliding_window=True)
    assert len(ds) == 2 * (10 - 3)
    x0, targets = ds[7 + 2]  # simulation 2, start frame 2
    data = torch.from_numpy(np.load(folder / "sim_0002.npy"))
    assert torch.equal(x0, data[2])
    assert torch.equal(targets, data[3:6])
    assert targets.shape == (3, 2, 8)


def test_non_overlapping_windows(folder):
    ds = HybridDataset(folder, [1], num_predict_steps=3, use_sliding_window=False)
    data = torch.from_numpy(np.load(folder / "sim_0001.npy"))
    assert len(ds) == 3  # starts 0, 3, 6
    assert torch.equal(ds[2][0], data[6]) and torch.equal(ds[2][1], data[7:10])


def test_lru_cache_evicts_least_recently_used(folder):
    ds = HybridDataset(folder, [0, 1, 2, 3], num_predict_steps=3, max_cached_sims=2)
    per_sim = 7
    ds[0], ds[per_sim]          # load 0, 1
    ds[0]                       # 0 is now most recent
    ds[2 * per_sim]             # load 2, evict 1
    assert ds.cached_sims == [0, 2]
    assert ds.loads == 3
    ds[per_sim]                 # 1 again: a miss, evicts 0
    assert ds.cached_sims == [2, 1] and ds.loads == 4
    ds[2 * per_sim + 1]         # 2 hit
    assert ds.loads == 4


def test_too_short_simulations(folder):
    with pytest.raises(ValueError, match="num_predict_steps"):
        HybridDataset(folder, [0], num_predict_steps=10)
