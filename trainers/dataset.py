"""HybridDataset: windows of cached simulations, loaded lazily through an LRU cache.

Only ``max_cached_sims`` simulations are held in memory at once; others are
read from their ``.npy`` file when a sample needs them. With DataLoader workers
each worker process holds its own cache.

Example:
    >>> import numpy as np, tempfile
    >>> from pathlib import Path
    >>> from trainers.dataset import HybridDataset
    >>> folder = Path(tempfile.mkdtemp())
    >>> for i in range(2):
    ...     np.save(folder / f"sim_{i:04d}.npy", np.zeros((6, 1, 8), np.float32))
    >>> ds = HybridDataset(folder, sims=[0, 1], num_predict_steps=2, max_cached_sims=1)
    >>> len(ds), ds[0][0].shape, ds[0][1].shape
    (8, torch.Size([1, 8]), torch.Size([2, 1, 8]))
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from trainers.data import load_simulation

__all__ = ["HybridDataset"]


class HybridDataset(Dataset):
    """Samples ``(initial_state [C, ...], targets [T, C, ...])`` from cached simulations.

    Args:
        folder: The simulation cache folder (see :func:`trainers.data.ensure_simulations`).
        sims: Indices of the simulations to draw from.
        num_predict_steps: ``T``, the number of target frames after the initial state.
        use_sliding_window: Every frame that leaves room for ``T`` targets starts a sample;
            otherwise windows do not overlap (starts at 0, T, 2T, ...).
        max_cached_sims: How many simulations the LRU cache holds.

    Raises:
        ValueError: a simulation is too short for ``num_predict_steps`` or ``sims`` is empty.
    """

    def __init__(self, folder: str | os.PathLike[str], sims: Sequence[int], *, num_predict_steps: int,
                 use_sliding_window: bool = True, max_cached_sims: int = 5) -> None:
        if not sims:
            raise ValueError("HybridDataset needs at least one simulation index")
        if max_cached_sims < 1:
            raise ValueError(f"max_cached_sims must be >= 1, got {max_cached_sims}")
        self.folder = Path(folder)
        self.sims = list(sims)
        self.num_predict_steps = num_predict_steps
        self.max_cached_sims = max_cached_sims
        self._cache: OrderedDict[int, torch.Tensor] = OrderedDict()
        self.loads = 0  # simulations read from disk (cache misses)
        frames = self._frames(self.sims[0])
        last_start = frames - 1 - num_predict_steps
        if last_start < 0:
            raise ValueError(f"simulations have {frames} frames, too few for num_predict_steps="
                             f"{num_predict_steps}")
        stride = 1 if use_sliding_window else num_predict_steps
        self._starts = list(range(0, last_start + 1, stride))
        self._index = [(s, t) for s in self.sims for t in self._starts]

    def _frames(self, sim: int) -> int:
        # A memory map reads only the header, not the data.
        return int(np.load(self.folder / f"sim_{sim:04d}.npy", mmap_mode="r", allow_pickle=False).shape[0])

    def simulation(self, sim: int) -> torch.Tensor:
        """The whole simulation ``[frames, C, ...]``, through the LRU cache."""
        cached = self._cache.get(sim)
        if cached is not None:
            self._cache.move_to_end(sim)
            return cached
        tensor = torch.from_numpy(load_simulation(self.folder, sim))
        self.loads += 1
        self._cache[sim] = tensor
        while len(self._cache) > self.max_cached_sims:
            self._cache.popitem(last=False)
        return tensor

    @property
    def cached_sims(self) -> list[int]:
        """Simulation indices currently cached, least recently used first."""
        return list(self._cache)

    def __len__(self) -> int:
        return len(self._index)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        sim, start = self._index[i]
        data = self.simulation(sim)
        return data[start], data[start + 1:start + 1 + self.num_predict_steps]
