"""``BatchMemoryProfiler``: memory between named checkpoints inside one batch.

Console formats (GPU / CPU-only)::

    Memory profile:
      start → data_to_gpu: GPU 29.1 MB (+19.0 MB)
      start → data_to_gpu: GPU n/a, CPU 1634.7 MB (+19.0 MB)

On CPU the line keeps its shape, says ``GPU n/a`` and carries the RSS and its change.

Example:
    >>> import io, torch
    >>> from tbmem._internal.monitor import BatchMemoryProfiler
    >>> out = io.StringIO()
    >>> profiler = BatchMemoryProfiler(file=out)
    >>> profiler.checkpoint("start")
    >>> x = torch.ones(1024, 1024)
    >>> profiler.checkpoint("allocate")
    >>> profiler.print_summary()
    >>> out.getvalue().splitlines()[1].startswith("  start → allocate: ")
    True
    >>> profiler.reset()
"""

from __future__ import annotations

from typing import Any, TextIO

from tbmem._internal.monitor._checks import DeviceLike, check_device, check_file, hook_failed
from tbmem._internal.monitor.formatting import format_delta, format_mb
from tbmem._internal.monitor.output import emit
from tbmem._internal.monitor.readings import Reading, read
from tbmem._internal.monitor.sink import Item, make_sink

__all__ = ["BatchMemoryProfiler", "transition_line"]


def _delta(now: float | None, before: float | None) -> float | None:
    return None if now is None or before is None else now - before


def transition_line(start: str, end: str, before: Reading, after: Reading) -> str:
    """``'start → data_to_gpu: GPU 29.1 MB (+19.0 MB)'``, or the CPU-only form."""
    if after.has_gpu:
        # CUDA first used in this interval: nothing was allocated before it.
        base = before.gpu_allocated if before.has_gpu else 0.0
        return f"{start} → {end}: GPU {format_mb(after.gpu_allocated)} ({format_delta(_delta(after.gpu_allocated, base))})"
    return f"{start} → {end}: GPU n/a, CPU {format_mb(after.cpu)} ({format_delta(_delta(after.cpu, before.cpu))})"


class BatchMemoryProfiler:
    """Memory at named checkpoints of a batch, printed as transitions.

    Args:
        enabled: False (or :meth:`disable`) makes ``checkpoint`` and ``print_summary`` no-ops.
        device: CUDA device to read (None: current device).
        writer: Optional MemoryWriter; each finished profile (at ``print_summary`` or
            ``reset``, once) writes one event with ``Monitor/Operation/<a>_to_<b>_cpu_delta_MB``
            (and ``_gpu_delta_MB``) per transition, at step = profile index.
        file: Where to print (default: the monitors' shared output).

    Example:
        >>> from tbmem._internal.monitor import BatchMemoryProfiler
        >>> profiler = BatchMemoryProfiler()
        >>> profiler.disable()
        >>> profiler.checkpoint("start"); len(profiler.checkpoints)
        0
    """

    def __init__(self, enabled: bool = True, *, device: DeviceLike = None, writer: Any = None,
                 file: TextIO | None = None) -> None:
        self.enabled = bool(enabled)
        self.device = check_device(device)
        self.file = check_file(file)
        self._sink = make_sink(writer)
        self._points: list[tuple[str, Reading]] = []
        self._written = False
        self.profiles_written = 0

    @property
    def checkpoints(self) -> tuple[tuple[str, Reading], ...]:
        """(name, reading) pairs of the current profile."""
        return tuple(self._points)

    def enable(self) -> None:
        """Profile again."""
        self.enabled = True

    def disable(self) -> None:
        """Stop profiling (e.g. after the first few batches)."""
        self.enabled = False

    def checkpoint(self, name: str) -> None:
        """Read memory now under ``name``."""
        if not self.enabled:
            return
        try:
            self._points.append((str(name), read(self.device)))
            self._written = False
        except Exception as exc:  # noqa: BLE001 - monitoring never raises into training
            hook_failed("BatchMemoryProfiler.checkpoint", exc)

    def summary_lines(self) -> list[str]:
        """The lines :meth:`print_summary` prints (empty with fewer than two checkpoints)."""
        if len(self._points) < 2:
            return []
        pairs = zip(self._points, self._points[1:])
        return ["Memory profile:"] + [f"  {transition_line(a, b, ra, rb)}" for (a, ra), (b, rb) in pairs]

    def print_summary(self) -> None:
        """Print the transitions between consecutive checkpoints (and write them once)."""
        if not self.enabled:
            return
        try:
            lines = self.summary_lines()
            if lines:
                emit(*lines, file=self.file)
            self._write()
        except Exception as exc:  # noqa: BLE001 - monitoring never raises into training
            hook_failed("BatchMemoryProfiler.print_summary", exc)

    def reset(self) -> None:
        """Start a new profile (writes the finished one first if it was not written)."""
        try:
            self._write()
        except Exception as exc:  # noqa: BLE001 - monitoring never raises into training
            hook_failed("BatchMemoryProfiler.reset", exc)
        self._points.clear()
        self._written = False

    def _write(self) -> None:
        if self._sink is None or self._written or len(self._points) < 2:
            return
        items: list[Item] = []
        for (a, ra), (b, rb) in zip(self._points, self._points[1:]):
            name = f"{a}_to_{b}"
            gpu_before = ra.gpu_allocated if ra.has_gpu else (0.0 if rb.has_gpu else None)
            items += [("op_cpu_delta", name, _delta(rb.cpu, ra.cpu)),
                      ("op_gpu_delta", name, _delta(rb.gpu_allocated, gpu_before))]
        self._sink.write(items, self.profiles_written)
        self.profiles_written += 1
        self._written = True
