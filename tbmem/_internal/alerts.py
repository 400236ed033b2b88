"""Alerts: a console warning, a TensorBoard text entry and optionally a snapshot when memory crosses a line.

:class:`tbmem.MemoryWriter` (``alerts=...``) hands each memory record's raw readings
to an :class:`AlertMonitor`, which checks four conditions:

* ``device_percent``: device memory in use, ``(total - free) / total`` as the driver
  sees it (every process and context), at or above this percentage;
* ``host_percent``: system RAM in use at or above this percentage;
* ``growth_mb_per_1k`` / ``rss_growth_mb_per_1k``: allocated device memory / process RSS
  grows steadily over the last ``growth_window`` records, by the test of the leak
  detector of :mod:`tbmem._internal.trend` (slope at least the threshold in MB per 1000
  steps, confidence interval above zero, both halves of the window growing);
* ``alloc_retries``: the caching allocator's retry count rose since the previous record
  (it had to free its cache to satisfy an allocation: memory pressure).

An alert fires on the record where its condition becomes true: one warning on the
``tbmem`` logger, one text entry ``Memory/Alerts`` at that step (all alerts of a
step in one entry), and with ``snapshot=True`` a memory snapshot written right then.
Each alert fires once per run; ``repeat=True`` re-arms it once the condition has
cleared (percentages must fall ``hysteresis`` points below their threshold).

Example:
    >>> from tbmem._internal.alerts import AlertConfig, AlertMonitor
    >>> monitor = AlertMonitor(AlertConfig(host_percent=80.0))
    >>> [a.kind for a in monitor.check(0, {"ram_system_percent": 50.0})]
    []
    >>> [a.kind for a in monitor.check(10, {"ram_system_percent": 85.0})]
    ['host_percent']
    >>> [a.kind for a in monitor.check(20, {"ram_system_percent": 90.0})]  # fired already
    []
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np

from tbmem._internal._fields import flags, integer, optional_config, unknown_keys
from tbmem._internal._log import logger
from tbmem._internal.tags import TAGS
from tbmem._internal.trend import fit_trend

if TYPE_CHECKING:  # pragma: no cover
    from tbmem._internal._emit import Emitter

__all__ = ["AlertConfig", "Alert", "AlertMonitor", "ALERTS_TEXT_TAG"]

#: Text tag of the alert entries (``add_text`` appends ``/text_summary``).
ALERTS_TEXT_TAG = TAGS["alerts_text"].tag
_GIB = float(2**30)


@dataclass(frozen=True, kw_only=True)
class AlertConfig:
    """Thresholds of :class:`AlertMonitor`; None switches one condition off.

    Attributes:
        device_percent: Device memory in use (all processes), percent of the total.
        host_percent: System RAM in use, percent.
        growth_mb_per_1k: Steady growth of allocated device memory, MB per 1000 steps.
        rss_growth_mb_per_1k: Steady growth of the process's RSS, MB per 1000 steps
            (RSS includes allocator caches, hence the larger default).
        growth_window: Records the growth test looks at (the last ones).
        alloc_retries: Alert when the CUDA allocator's retry count rises.
        snapshot: Write a memory snapshot at the step an alert fires.
        repeat: Re-arm an alert once its condition has cleared (else once per run).
        hysteresis: Percentage points below the threshold that clear a percent condition.

    Example:
        >>> AlertConfig.from_mapping({"device_percent": 95, "growth_window": 20}).growth_window
        20
        >>> AlertConfig(host_percent=120)
        Traceback (most recent call last):
        ...
        ValueError: AlertConfig.host_percent must be None or a percentage in (0, 100], got 120
    """

    device_percent: float | None = 90.0
    host_percent: float | None = 90.0
    growth_mb_per_1k: float | None = 5.0
    rss_growth_mb_per_1k: float | None = 100.0
    growth_window: int = 50
    alloc_retries: bool = True
    snapshot: bool = False
    repeat: bool = False
    hysteresis: float = 5.0

    def __post_init__(self) -> None:
        name = type(self).__name__
        for attr in ("device_percent", "host_percent"):
            v = getattr(self, attr)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 100):
                raise ValueError(f"{name}.{attr} must be None or a percentage in (0, 100], got {v!r}")
        for attr in ("growth_mb_per_1k", "rss_growth_mb_per_1k"):
            v = getattr(self, attr)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0):
                raise ValueError(f"{name}.{attr} must be None or > 0 (MB per 1000 steps), got {v!r}")
        integer(self.growth_window, f"{name}.growth_window", low=4, hint=" (records)")
        h = self.hysteresis
        if isinstance(h, bool) or not isinstance(h, (int, float)) or not 0 <= h < 100:
            raise ValueError(f"{name}.hysteresis must be in [0, 100) percentage points, got {h!r}")
        flags(self, "alloc_retries", "snapshot", "repeat")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "AlertConfig":
        """Build from a plain mapping (a Hydra/OmegaConf node), naming any unknown key."""
        problem = unknown_keys(cls, values)
        if problem:
            raise ValueError(problem)
        return cls(**dict(values))

    @classmethod
    def coerce(cls, value: Any) -> "AlertConfig | None":
        """``True`` -> the defaults, ``False``/None -> None, a mapping or an AlertConfig -> an AlertConfig."""
        return optional_config(cls, value, "alerts must be true/false, a mapping of AlertConfig keys or an AlertConfig")


@dataclass(frozen=True)
class Alert:
    """One alert that fired.

    Attributes:
        kind: ``device_percent``, ``host_percent``, ``growth:vram_allocated``,
            ``growth:ram_rss`` or ``alloc_retries``.
        step: The step of the record that crossed the line.
        value: The reading (percent, MB per 1000 steps, or the retry count).
        threshold: The line it crossed.
        message: One sentence with the numbers.
    """

    kind: str
    step: int
    value: float
    threshold: float
    message: str


# tag-table key -> (tag used for the leak test's units, alert kind, config attribute, leak kind)
_GROWTH = (("vram_allocated", "Memory/GPU/vram_allocated_GB", "growth:vram_allocated", "growth_mb_per_1k", "exact"),
           ("ram_rss", "Memory/RAM/process_rss_GB", "growth:ram_rss", "rss_growth_mb_per_1k", "noisy"))


class AlertMonitor:
    """Checks each memory record against an :class:`AlertConfig` and reports what crossed.

    Args:
        config: The thresholds.
        emit: Where the text entry goes (:class:`tbmem._internal._emit.Emitter`, a writer's output); None:
            the console only.
        snapshot: Called with the step when an alert fires and ``config.snapshot`` is set;
            returns the paths written.
    """

    def __init__(self, config: AlertConfig, *, emit: Emitter | None = None,
                 snapshot: Callable[[int], list[str]] | None = None) -> None:
        self.config = config
        self.emit = emit
        self.snapshot = snapshot
        self.fired: list[Alert] = []
        self._armed: dict[str, bool] = {}
        self._history: dict[str, deque[tuple[int, float]]] = {
            key: deque(maxlen=config.growth_window) for key, *_ in _GROWTH}
        self._retries: tuple[int, float] | None = None  # (step, count) of the previous record

    # --- conditions ---------------------------------------------------------------------------
    def check(self, step: int, readings: Mapping[str, float]) -> list[Alert]:
        """The alerts that fire at this record (updates the state; writes nothing)."""
        cfg = self.config
        out: list[Alert] = []
        self._percent(out, step, "device_percent", cfg.device_percent, _device_percent(readings), readings)
        self._percent(out, step, "host_percent", cfg.host_percent, readings.get("ram_system_percent"), readings)
        for key, tag, kind, attr, leak_kind in _GROWTH:
            threshold = getattr(cfg, attr)
            if threshold is None or key not in readings:
                continue
            hist = self._history[key]
            hist.append((step, float(readings[key])))
            finding = _growth(hist, tag, leak_kind, threshold) if len(hist) == hist.maxlen else None
            flagged = finding is not None and finding.flagged
            if self._transition(kind, flagged):
                assert finding is not None
                what = "allocated device memory" if key == "vram_allocated" else "process RSS"
                out.append(Alert(kind=kind, step=step, value=finding.slope_mb_per_1k, threshold=threshold, message=(
                    f"{what} grows {finding.slope_mb_per_1k:+.1f} MB per 1000 steps over the last {len(hist)} "
                    f"records (steps {finding.start_step}..{finding.end_step}: {finding.start_mb:.1f} -> "
                    f"{finding.end_mb:.1f} MB; 95% interval {finding.low_mb_per_1k:+.1f}.."
                    f"{finding.high_mb_per_1k:+.1f}; threshold {threshold:g}): a leak?")))
        if cfg.alloc_retries and "vram_alloc_retries" in readings:
            count = float(readings["vram_alloc_retries"])
            previous = self._retries
            self._retries = (step, count)
            rose = previous is not None and count > previous[1]
            if self._transition("alloc_retries", rose):
                assert previous is not None
                frag = readings.get("fragmentation")
                out.append(Alert(kind="alloc_retries", step=step, value=count, threshold=previous[1], message=(
                    f"CUDA allocation retries rose from {previous[1]:.0f} (step {previous[0]}) to {count:.0f}: the "
                    "allocator had to free its cache to find memory (memory pressure"
                    + (f"; fragmentation {frag:.1f}%" if frag is not None else "") + ")")))
        return out

    def _percent(self, out: list[Alert], step: int, kind: str, threshold: float | None, value: float | None,
                 readings: Mapping[str, float]) -> None:
        if threshold is None or value is None:
            return
        above = value >= threshold
        if not above and value > threshold - self.config.hysteresis and not self._armed.get(kind, True):
            above = True  # inside the hysteresis band: still the same episode
        if self._transition(kind, above):
            out.append(Alert(kind=kind, step=step, value=value, threshold=threshold,
                             message=_percent_message(kind, value, threshold, readings)))

    def _transition(self, kind: str, condition: bool) -> bool:
        """True when ``kind`` fires now: its condition holds and it is armed."""
        armed = self._armed.get(kind, True)
        if condition and armed:
            self._armed[kind] = False
            return True
        if not condition and not armed and self.config.repeat:
            self._armed[kind] = True
        return False

    # --- reporting ----------------------------------------------------------------------------
    def on_record(self, step: int, readings: Mapping[str, float]) -> list[Alert]:
        """Check a record; for what fires: warn, write the text entry, take the snapshot."""
        alerts = self.check(step, readings)
        if not alerts:
            return alerts
        self.fired.extend(alerts)
        for alert in alerts:
            logger.warning("tbmem alert at step %d: %s", step, alert.message)
        paths: list[str] = []
        if self.config.snapshot and self.snapshot is not None:
            paths = list(self.snapshot(step))
        if self.emit is not None:
            lines = [f"**Memory alert** at step {step}:", ""] + [f"- `{a.kind}`: {a.message}" for a in alerts]
            if paths:
                lines += ["", "Snapshot written: " + ", ".join(f"`{p}`" for p in paths)]
            elif self.config.snapshot:
                lines += ["", "No snapshot could be written (see the tbmem log)."]
            self.emit.add_text(ALERTS_TEXT_TAG, "\n".join(lines), step)
        return alerts


def _device_percent(readings: Mapping[str, float]) -> float | None:
    total, free = readings.get("vram_total"), readings.get("vram_free")
    if total and free is not None:
        return (total - free) / total * 100.0
    return readings.get("vram_percent")


def _percent_message(kind: str, value: float, threshold: float, r: Mapping[str, float]) -> str:
    if kind == "device_percent":
        text = f"device memory {value:.1f}% in use (threshold {threshold:g}%)"
        if "vram_total" in r and "vram_free" in r:
            text += f": {(r['vram_total'] - r['vram_free']) / _GIB:.2f} of {r['vram_total'] / _GIB:.2f} GiB"
        if "vram_reserved" in r:
            text += (f"; this process reserves {r['vram_reserved'] / _GIB:.2f} GiB, its tensors hold "
                     f"{r.get('vram_allocated', 0.0) / _GIB:.2f} GiB")
        return text
    text = f"system RAM {value:.1f}% in use (threshold {threshold:g}%)"
    if "ram_system_used" in r and "ram_system_available" in r:
        text += (f": {r['ram_system_used'] / _GIB:.2f} GiB used, {r['ram_system_available'] / _GIB:.2f} GiB "
                 "available")
    if "ram_rss" in r:
        text += f"; this process's RSS {r['ram_rss'] / _GIB:.2f} GiB"
    return text


def _growth(hist: deque, tag: str, kind: str, threshold: float) -> Any:
    # The leak detector's own test (slope, interval, both halves), over the window only.
    steps = np.array([s for s, _ in hist], dtype=np.int64)
    values = np.array([v / _GIB for _, v in hist], dtype=float)  # the tag's unit (GB)
    if len(np.unique(steps)) < 2:
        return None
    return fit_trend("", tag, kind, steps, values, threshold=threshold, skip_fraction=0.0, min_points=3,
                     confidence=0.95)
