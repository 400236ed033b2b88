"""One measured training step: what was alive before it, and the bytes it added over time.

Before the step, a tensor census names everything alive on the device (parameters,
gradients, optimizer state, buffers, the batch, the rest). During the step, the
every-device allocation recorder of the snapshots (:class:`tbmem._internal.snapshot.recorder.DispatchRecorder`)
sees each allocation and each free, so the bytes the step adds are known after every
event, by category; on CUDA the caching allocator's own peak is read as well (it
also sees what no operator returns: rounding, library workspaces).

Example:
    >>> import torch
    >>> from tbmem._internal.forecast.measure import measure_step
    >>> model = torch.nn.Linear(64, 64)
    >>> def step(x):
    ...     model(x).sum().backward()
    >>> m = measure_step(step, torch.zeros(8, 64), device=torch.device("cpu"), models=[model])
    >>> m.before["parameters"] >= 64 * 64 * 4 + 64 * 4  # this model's, and any other alive
    True
    >>> m.step_peak_bytes  # the gradients it creates (16,640 B), the loss and its gradient (2 x 4 B)
    16648
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import torch

from tbmem._internal import _torch_private as tp
from tbmem._internal.snapshot.recorder import DispatchRecorder

__all__ = ["StepMeasurement", "measure_step", "batch_bytes", "BEFORE_CATEGORIES", "STEP_CATEGORIES",
           "device_name"]

#: What was alive before the step (census categories, the batch split off "other").
BEFORE_CATEGORIES = ("parameters", "gradients", "optimizer_state", "buffers", "activations", "batch", "other",
                     "unattributed")
#: Net bytes the step added, by the recorder's categories (frees of older storages are negative).
STEP_CATEGORIES = ("activations", "backward", "no_grad", "gradients", "optimizer_state", "parameters", "other")
_RECORDER_TO_STEP = {"activation": "activations", "backward": "backward", "no_grad": "no_grad",
                     "gradient": "gradients", "optimizer_state": "optimizer_state", "parameter": "parameters"}


def device_name(device: torch.device) -> str:
    """``cpu`` or ``cuda:<index>``: how the census names devices."""
    if device.type == "cuda":
        return f"cuda:{device.index if device.index is not None else torch.cuda.current_device()}"
    return device.type


@dataclass
class StepMeasurement:
    """The memory of one training step at one batch size.

    Attributes:
        batch_size: The batch size.
        device: ``cpu`` or ``cuda:<index>``.
        before: Bytes alive on the device before the step, by category (see ``BEFORE_CATEGORIES``).
        step_peak_bytes: The most bytes the step held above ``before`` (dispatch recorder).
        at_peak: Those bytes by category at that moment (sums to ``step_peak_bytes``).
        peak_bytes: Live tensor bytes at the step's peak: on CUDA the allocator's peak,
            elsewhere ``sum(before) + step_peak_bytes``.
        allocator_peak_bytes: CUDA: ``allocated_bytes.all.peak`` over the step; else None.
        seconds: Wall time of the recorded step.
        n_events: Allocations and frees the recorder saw.
        predicted_bytes: What a :class:`~tbmem.forecast.Forecast` predicted for this size (set by
            ``Forecast.measure``), else None.
    """

    batch_size: int
    device: str
    before: dict[str, int]
    step_peak_bytes: int
    at_peak: dict[str, int]
    peak_bytes: int
    allocator_peak_bytes: int | None = None
    seconds: float = 0.0
    n_events: int = 0
    predicted_bytes: int | None = None
    # per event, for the fit (not part of the repr)
    net: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)
    by_category: np.ndarray = field(default_factory=lambda: np.zeros((len(STEP_CATEGORIES), 0)), repr=False)
    signature: bytes = field(default=b"", repr=False)
    phases: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64), repr=False)

    @property
    def before_bytes(self) -> int:
        """Everything alive before the step."""
        return sum(self.before.values())

    @property
    def allocator_overhead_bytes(self) -> int:
        """CUDA: allocator peak minus what the recorder explains (rounding, workspaces); else 0."""
        if self.allocator_peak_bytes is None:
            return 0
        return self.allocator_peak_bytes - (self.before_bytes + self.step_peak_bytes)

    @property
    def error(self) -> float | None:
        """``predicted / measured - 1`` when a prediction was attached, else None."""
        if self.predicted_bytes is None or self.peak_bytes <= 0:
            return None
        return self.predicted_bytes / self.peak_bytes - 1.0

    def drop_events(self) -> None:
        """Forget the per-event arrays (kept only while fitting)."""
        self.net = np.zeros(0)
        self.by_category = np.zeros((len(STEP_CATEGORIES), 0))
        self.phases = np.zeros(0, dtype=np.int64)


class _DeviceRecorder(DispatchRecorder):
    """The snapshots' recorder, counting only storages on one device (a CUDA step's CPU scalars
    are not device memory)."""

    def __init__(self, device: torch.device, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._want = device

    def _record(self, t: torch.Tensor, args: tuple) -> None:
        d = t.device
        if d.type == self._want.type and (d.index == self._want.index or self._want.index is None):
            super()._record(t, args)


def _tensors(obj: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth < 6 and isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v, depth + 1)
    elif depth < 6 and isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v, depth + 1)
    elif depth < 6 and hasattr(obj, "__dataclass_fields__"):
        for name in obj.__dataclass_fields__:
            yield from _tensors(getattr(obj, name, None), depth + 1)


def batch_bytes(batch: Any, device: str) -> int:
    """Bytes of the storages of the tensors in ``batch`` (nested tuples, lists, dicts,
    dataclasses) that live on ``device``, each storage once."""
    seen: set[int] = set()
    total = 0
    for t in _tensors(batch):
        if t.layout != torch.strided or t.device.type == "meta":
            continue
        if device_name(t.device) != device:
            continue
        s = t.untyped_storage()
        if s.data_ptr() not in seen:
            seen.add(s.data_ptr())
            total += s.nbytes()
    return total


def _census_before(device: torch.device, batch: Any, models: list[torch.nn.Module],
                   optimizers: list[torch.optim.Optimizer]) -> dict[str, int]:
    from tbmem._internal.census import take_census

    name = device_name(device)
    index = device.index if device.type == "cuda" else None
    census = take_census(models=models, optimizers=optimizers, device=index, numpy_scan="off", top_k=0)
    before = dict.fromkeys(BEFORE_CATEGORIES, 0)
    for rec in census.records:
        if rec.device == name:
            before[rec.category if rec.category in before else "other"] += rec.bytes
    in_batch = min(batch_bytes(batch, name), before["other"])
    before["batch"] = in_batch
    before["other"] -= in_batch
    if device.type == "cuda":
        stats = tp.cuda_memory_stats(index if index is not None else torch.cuda.current_device()) or {}
        allocated = int(stats.get("allocated_bytes.all.current", 0))
        before["unattributed"] = allocated - sum(before.values())
    return before


def _events(snap: Any) -> tuple[np.ndarray, np.ndarray, bytes, np.ndarray]:
    """(net bytes after each event, per step category after each event, signature, phase labels)."""
    a = snap.allocs
    n = snap.n_events
    cats = [STEP_CATEGORIES.index(_RECORDER_TO_STEP.get(c, "other")) for c in snap.categories]
    cat = np.asarray(cats, dtype=np.int64)[a["category"]] if len(a["size"]) else np.zeros(0, dtype=np.int64)
    delta = np.zeros((len(STEP_CATEGORIES), n), dtype=np.int64)
    started, ended = a["start"] >= 0, a["end"] >= 0
    np.add.at(delta, (cat[started], a["start"][started]), a["size"][started])
    np.add.at(delta, (cat[ended], a["end"][ended]), -a["size"][ended])
    by_category = np.cumsum(delta, axis=1)
    net = by_category.sum(axis=0)
    # signature: +raw category for an allocation, -raw category for a free, per event
    raw = a["category"] + 1
    sig = np.zeros(n, dtype=np.int32)
    sig[a["start"][started]] = raw[started]
    sig[a["end"][ended]] = -raw[ended]
    # phase: the raw category of the latest allocation (frees belong to the phase they happen in)
    phase = np.where(sig > 0, sig, 0)
    idx = np.maximum.accumulate(np.where(phase > 0, np.arange(n), 0)) if n else np.zeros(0, dtype=np.int64)
    phases = phase[idx]
    return net, by_category, sig.tobytes(), phases


def measure_step(step: Callable[[Any], Any], batch: Any, *, device: torch.device,
                 models: Iterable[torch.nn.Module] = (), optimizers: Iterable[torch.optim.Optimizer] = (),
                 batch_size: int = 0) -> StepMeasurement:
    """Run ``step(batch)`` once, recorded, and measure its memory.

    Garbage collection is paused during the step so that frees happen where the step's own
    references end, the same way at every batch size.

    Raises:
        RuntimeError: the recorder failed (its error is chained).
        Whatever ``step`` raises (an out-of-memory error included), after recording stopped.
    """
    models, optimizers = list(models), list(optimizers)
    # Cyclic garbage of the previous step would count as alive; the young generations hold it,
    # and a full collection costs ~0.2 s on a large heap.
    gc.collect(1)
    before = _census_before(device, batch, models, optimizers)
    cuda = device.type == "cuda"
    index = (device.index if device.index is not None else torch.cuda.current_device()) if cuda else None
    rec = _DeviceRecorder(device, backend="dispatch", stacks="none", max_entries=2**62, models=lambda: models,
                          optimizers=lambda: optimizers)
    gc_was_enabled = gc.isenabled()
    if index is not None:  # CUDA
        tp.synchronize_if_pending(index)
        tp.reset_cuda_peaks(index)
    gc.disable()
    start = time.perf_counter()
    try:
        rec.start()
        try:
            step(batch)
        finally:
            rec.stop()
        if cuda:
            tp.synchronize_if_pending(index)
    finally:
        if gc_was_enabled:
            gc.enable()
    seconds = time.perf_counter() - start
    if rec.failed is not None:
        raise RuntimeError("the allocation recorder failed during the step") from rec.failed
    allocator_peak = None
    if index is not None:  # CUDA
        stats = tp.cuda_memory_stats(index) or {}
        allocator_peak = int(stats.get("allocated_bytes.all.peak", 0))
    snap = rec.snapshot(kind="snapshot", step=0)
    rec.reset()
    net, by_category, signature, phases = _events(snap)
    peak_event = int(np.argmax(net)) if net.size else -1
    step_peak = max(int(net[peak_event]), 0) if net.size else 0
    at_peak = {c: int(by_category[i, peak_event]) if step_peak > 0 else 0 for i, c in enumerate(STEP_CATEGORIES)}
    total_before = sum(before.values())
    peak = allocator_peak if allocator_peak is not None else total_before + step_peak
    return StepMeasurement(batch_size=batch_size, device=device_name(device), before=before,
                           step_peak_bytes=step_peak, at_peak=at_peak, peak_bytes=peak,
                           allocator_peak_bytes=allocator_peak, seconds=seconds, n_events=snap.n_events,
                           net=net, by_category=by_category, signature=signature, phases=phases)
