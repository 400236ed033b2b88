"""Running the user's step: one unrecorded step where needed, then the recorded one; errors named.

Example:
    >>> import torch
    >>> from tbmem._internal.forecast.probe import Runner
    >>> runner = Runner(lambda x: (x * 2).sum(), lambda n: torch.ones(n), torch.device("cpu"), [], [])
    >>> runner.measure(16).step_peak_bytes  # the doubled batch and its sum
    68
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import torch

from tbmem._internal import _torch_private as tp
from tbmem._internal.forecast.measure import StepMeasurement, measure_step

__all__ = ["ForecastError", "Runner", "check_n", "incremental_census", "progress"]


class ForecastError(RuntimeError):
    """The forecast cannot be made (bad arguments, a probe that does not fit in memory)."""


def check_n(n: int) -> int:
    """``n`` as an int; ValueError unless it is an integer >= 1."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"batch size must be an integer >= 1, got {n!r}")
    return int(n)


class Runner:
    """Runs and measures the user's step at one batch size."""

    def __init__(self, step: Callable[[Any], Any], make_batch: Callable[[int], Any], device: torch.device,
                 models: list[torch.nn.Module], optimizers: list[torch.optim.Optimizer]) -> None:
        self.step, self.make_batch, self.device = step, make_batch, device
        self.models, self.optimizers = models, optimizers

    def run(self, n: int) -> None:
        """One unrecorded step at batch size ``n``."""
        batch = self.make_batch(n)
        try:
            self.step(batch)
        except tp.OutOfMemoryError as exc:
            raise ForecastError(f"a step at batch size {n} ran out of memory; probe smaller sizes") from exc

    def measure(self, n: int) -> StepMeasurement:
        """One recorded step at batch size ``n`` (on CUDA after an unrecorded one)."""
        if self.device.type == "cuda":
            # the first step at a new shape may autotune kernels with extra workspaces: not the steady state
            self.run(n)
        batch = self.make_batch(n)
        try:
            return measure_step(self.step, batch, device=self.device, models=self.models,
                                optimizers=self.optimizers, batch_size=n)
        except tp.OutOfMemoryError as exc:
            raise ForecastError(f"a step at batch size {n} ran out of memory; probe smaller sizes") from exc


@contextmanager
def incremental_census() -> Iterator[None]:
    """Let the census before each probe scan only what is new since the previous one."""
    from tbmem._internal.census import heap

    heap.start_capture()
    try:
        yield
    finally:
        heap.stop_capture()


def progress(sizes: list[int], enabled: bool) -> Iterable[int]:
    """``sizes``, with a progress bar on stderr when ``enabled`` and tqdm is installed."""
    if not enabled:
        return sizes
    try:
        from tqdm import tqdm
    except ImportError:
        return sizes
    return tqdm(sizes, desc="forecast: probing batch sizes", unit="size", file=sys.stderr)
