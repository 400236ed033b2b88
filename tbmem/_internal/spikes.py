"""Loss spikes and other anomalies of logged scalars, found online, with the memory around them.

:class:`tbmem.MemoryWriter` (``spikes=...``) hands every scalar written through ``write_scalars``
or ``add_scalar`` to a :class:`SpikeMonitor`. For each watched tag (defaults: ``Loss/*`` and
any ``*grad_norm*`` tag: the SyntheticTrainer's ``Train/grad_norm``) a :class:`SpikeDetector` applies
a robust rule: a value is *above the line* when it is more than ``factor`` times the median
of the tag's previous ``window`` values (a median, not a mean: one spike does not lift the
line for the next ones); ``patience`` values above the line in a row make a spike, reported
at the first of them; a NaN or infinite value is a spike at once. Nothing is checked before
``min_history`` values, and a tag whose median is not positive (a log-likelihood) is checked
for non-finite values only. After a spike the tag is quiet until a value falls below the
line again (one episode, one spike).

On a spike: one warning on the ``tbmem`` logger, one TensorBoard text entry
(``Anomalies/spikes``, at the spike's step), one JSON line in the run's side file
:data:`SPIKES_LOG` (which the Memory tab marks on its timeline and ``tbmem report`` lists
with the memory change around each), and with ``snapshot=True`` a memory snapshot written
right then. Like every monitor, a failure is reported once and switches it off.

The defaults follow llm-foundry's and tnt's loss-spike rules (2x a rolling average), with a
median for robustness and ``patience=1`` (llm-foundry waits for 5 outliers before stopping a
run; tbmem marks the step, so one is enough). Two tags are not watched by default, because
they jump by design: ``Loss/evaluation`` (the PhysicalTrainer's L-BFGS-B line search tries steps
that overshoot; its accepted iterates are ``Loss/iteration``, which is watched) and
``LBFGS/grad_norm`` (the gradient at L-BFGS-B's iterates rises and falls: on SciPy's Rosenbrock
it reaches 3-4x its rolling median, on an ill-conditioned least-squares problem 20-45x).

Example:
    >>> from tbmem._internal.spikes import SpikeConfig, SpikeDetector
    >>> detector = SpikeDetector(SpikeConfig(window=5, min_history=3))
    >>> [detector.update("Loss/batch", step, v) for step, v in enumerate([1.0, 1.0, 0.5, 0.5])]
    [None, None, None, None]
    >>> spike = detector.update("Loss/batch", 4, 5.0)
    >>> spike.step, spike.median, round(spike.ratio, 2)
    (4, 0.75, 6.67)
    >>> detector.update("Memory/RAM/process_rss_GB", 5, 99.0) is None  # not watched
    True
"""

from __future__ import annotations

import bisect
import fnmatch
import math
import os
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

from tbmem._internal._fields import flags, integer, optional_config, unknown_keys
from tbmem._internal._log import logger, report_once
from tbmem._internal.logdir.spikes import SPIKES_LOG, append_spike, read_spikes, spikes_log_path
from tbmem._internal.tags import FRAMEWORK_LOSS_TAGS, TAGS

if TYPE_CHECKING:  # pragma: no cover
    from tbmem._internal._emit import Emitter
    from tbmem._internal._safe_io import FaultLedger

__all__ = ["SpikeConfig", "Spike", "SpikeDetector", "SpikeMonitor", "SPIKES_LOG", "SPIKES_TEXT_TAG",
           "spikes_log_path", "read_spikes"]

#: The side file of a run's spikes, one JSON object per line (docs/analysis.md, "Loss spikes").
#: Text tag of the spike entries (``add_text`` appends ``/text_summary``).
SPIKES_TEXT_TAG = TAGS["spikes_text"].tag


@dataclass(frozen=True, kw_only=True)
class SpikeConfig:
    """What :class:`SpikeDetector` watches and the rule it applies.

    Attributes:
        tags: Shell-style patterns (``fnmatch``) of the tags watched.
        exclude: Patterns of tags never watched, even when ``tags`` matches them.
        factor: A value above ``factor`` times the rolling median is above the line.
        window: How many previous values of a tag the median is taken over.
        min_history: Values of a tag needed before its first check.
        patience: Values above the line in a row that make a spike (reported at the first).
        nonfinite: A NaN or infinite value is a spike.
        snapshot: Write a memory snapshot when a spike is found.
        max_spikes: Spikes reported per run; later ones are only counted (``SpikeMonitor.unreported``).

    Example:
        >>> SpikeConfig.from_mapping({"factor": 3, "tags": ["Loss/train"]}).tags
        ('Loss/train',)
        >>> SpikeConfig(factor=1.0)
        Traceback (most recent call last):
        ...
        ValueError: SpikeConfig.factor must be a number > 1, got 1.0
    """

    tags: tuple[str, ...] = ("Loss/*", *FRAMEWORK_LOSS_TAGS, "*grad_norm*")
    exclude: tuple[str, ...] = ("Loss/evaluation", "LBFGS/grad_norm")
    factor: float = 2.0
    window: int = 50
    min_history: int = 10
    patience: int = 1
    nonfinite: bool = True
    snapshot: bool = False
    max_spikes: int = 100

    def __post_init__(self) -> None:
        name = type(self).__name__
        for attr in ("tags", "exclude"):
            value = getattr(self, attr)
            if isinstance(value, str) or not all(isinstance(p, str) and p for p in value):
                raise ValueError(f"{name}.{attr} must be a list of tag patterns (strings), got {value!r}")
            object.__setattr__(self, attr, tuple(value))
        f = self.factor
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not math.isfinite(f) or f <= 1:
            raise ValueError(f"{name}.factor must be a number > 1, got {f!r}")
        for attr, low in (("window", 3), ("min_history", 1), ("patience", 1), ("max_spikes", 1)):
            integer(getattr(self, attr), f"{name}.{attr}", low=low)
        if self.min_history > self.window:
            raise ValueError(f"{name}.min_history ({self.min_history}) must be <= window ({self.window})")
        flags(self, "nonfinite", "snapshot")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "SpikeConfig":
        """Build from a plain mapping (a Hydra/OmegaConf node), naming any unknown key."""
        problem = unknown_keys(cls, values)
        if problem:
            raise ValueError(problem)
        fields: dict[str, Any] = {k: (tuple(v) if k in ("tags", "exclude") and not isinstance(v, str) else v)
                                  for k, v in dict(values).items()}
        return cls(**fields)

    @classmethod
    def coerce(cls, value: Any) -> "SpikeConfig | None":
        """``True`` -> the defaults, ``False``/None -> None, a mapping or a SpikeConfig -> a SpikeConfig."""
        return optional_config(cls, value, "spikes must be true/false, a mapping of SpikeConfig keys or a SpikeConfig")


@dataclass(frozen=True)
class Spike:
    """One spike: ``tag`` jumped at ``step``.

    Attributes:
        tag: The scalar's tag.
        step: The first step above the line.
        value: The value there.
        median: The rolling median the line was drawn from (None: too few values before a NaN).
        ratio: ``value / median`` (None for a non-finite value).
        kind: ``"spike"`` or ``"nonfinite"``.
        confirmed_step: The step at which ``patience`` values were above the line (the snapshot's).
        snapshot: Paths of the snapshot written for it.
    """

    tag: str
    step: int
    value: float
    median: float | None
    ratio: float | None
    kind: str
    confirmed_step: int
    snapshot: tuple[str, ...] = field(default=())

    def describe(self) -> str:
        """One sentence with the numbers."""
        if self.kind == "nonfinite":
            return f"`{self.tag}` is {self.value} at step {self.step}"
        return (f"`{self.tag}` = {self.value:.6g} at step {self.step}: {self.ratio:.3g}x the median "
                f"{self.median:.6g} of its previous values")

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-able dict (NaN and infinity as strings)."""
        out = asdict(self)
        out["snapshot"] = list(self.snapshot)
        for key in ("value", "ratio"):
            if isinstance(out[key], float) and not math.isfinite(out[key]):
                out[key] = str(out[key])
        return out


class _Track:
    """One tag's last ``window`` values, in order and sorted (the median is read off the sorted copy:
    about 0.3 us a value where ``statistics.median`` takes 2-4 us, and this runs at every logged loss)."""

    __slots__ = ("history", "ordered", "above", "first", "armed")

    def __init__(self, window: int) -> None:
        self.history: deque[float] = deque(maxlen=window)
        self.ordered: list[float] = []
        self.above = 0  # values above the line in a row
        self.first: tuple[int, float, float] | None = None  # (step, value, median) of the first of them
        self.armed = True

    def median(self) -> float:
        o = self.ordered
        n = len(o)
        return o[n // 2] if n % 2 else (o[n // 2 - 1] + o[n // 2]) / 2

    def push(self, value: float) -> None:
        h = self.history
        if len(h) == h.maxlen:
            del self.ordered[bisect.bisect_left(self.ordered, h[0])]
        h.append(value)
        bisect.insort(self.ordered, value)


class SpikeDetector:
    """The rule of :class:`SpikeConfig`, applied value by value; writes nothing."""

    def __init__(self, config: SpikeConfig) -> None:
        self.config = config
        self._tracks: dict[str, _Track] = {}
        self._watched: dict[str, bool] = {}

    def watches(self, tag: str) -> bool:
        """Whether ``tag`` matches the config's patterns (cached: called for every scalar written)."""
        known = self._watched.get(tag)
        if known is None:
            cfg = self.config
            known = (any(fnmatch.fnmatchcase(tag, p) for p in cfg.tags)
                     and not any(fnmatch.fnmatchcase(tag, p) for p in cfg.exclude))
            if len(self._watched) < 10_000:
                self._watched[tag] = known
        return known

    def update(self, tag: str, step: int, value: float) -> Spike | None:
        """Feed one value of ``tag``; the spike it completes, if any."""
        if not self.watches(tag):
            return None
        cfg = self.config
        track = self._tracks.get(tag)
        if track is None:
            track = self._tracks[tag] = _Track(cfg.window)
        value = float(value)
        if not math.isfinite(value):
            if not (cfg.nonfinite and track.armed):
                return None
            track.armed = False
            median = track.median() if track.history else None
            return Spike(tag, int(step), value, median, None, "nonfinite", int(step))
        spike = None
        median = track.median() if len(track.history) >= cfg.min_history else 0.0
        if median > 0 and value > cfg.factor * median:
            track.above += 1
            if track.first is None:
                track.first = (int(step), value, median)
            if track.above >= cfg.patience and track.armed:
                track.armed = False
                s, v, m = track.first
                spike = Spike(tag, s, v, m, v / m, "spike", int(step))
        else:  # below the line (or not checked yet): the episode, if any, is over
            track.above, track.first, track.armed = 0, None, True
        track.push(value)
        return spike


class SpikeMonitor:
    """Watches the scalars a writer writes and reports each spike (see the module docstring).

    Args:
        config: The rule and what to watch.
        emit: Where the text entry goes (a :class:`tbmem._internal._emit.Emitter`: a writer's output, its run
            folder for the side file, its fault ledger); None: the console only.
        snapshot: Called with the step when a spike is found and ``config.snapshot`` is set;
            returns the paths written.
    """

    def __init__(self, config: SpikeConfig, *, emit: Emitter | None = None,
                 snapshot: Callable[[int], list[str]] | None = None) -> None:
        self.config = config
        self.detector = SpikeDetector(config)
        self.emit = emit
        self.snapshot = snapshot
        self.faults: FaultLedger | None = emit.faults if emit is not None else None
        self.found: list[Spike] = []
        self.off = False
        self.unreported = 0
        self._snapshot_at: tuple[int, tuple[str, ...]] | None = None  # (step, paths) of the last snapshot

    def on_scalars(self, values: Mapping[str, Any], step: int) -> None:
        """Check the scalars of one event; never raises (a failure switches the monitor off)."""
        if self.off:
            return
        try:
            detector = self.detector
            known = detector._watched  # the cache watches() fills: a dict lookup per tag, no call
            for tag, value in values.items():
                watched = known.get(tag)
                if watched or (watched is None and detector.watches(tag)):
                    spike = detector.update(tag, step, value if type(value) is float else _number(value))
                    if spike is not None:
                        self._report(spike)
        except Exception as exc:  # noqa: BLE001 - monitoring must never break training
            report_once("writer:spikes", "tbmem: the spike detector failed and is switched off", exc=exc)
            self.off = True

    def on_scalar(self, tag: str, value: Any, step: int | None) -> None:
        """One ``add_scalar`` value (none without a step); never raises."""
        if step is not None and not self.off and self.detector.watches(tag):
            self.on_scalars({tag: value}, int(step))

    def _report(self, spike: Spike) -> None:
        cfg = self.config
        if len(self.found) >= cfg.max_spikes:
            self.unreported += 1
            return
        if cfg.snapshot and self.snapshot is not None:
            at = spike.confirmed_step  # one snapshot per step: a loss and its gradient norm often jump together
            if self._snapshot_at is None or self._snapshot_at[0] != at:
                self._snapshot_at = (at, tuple(self.snapshot(at)))
            spike = Spike(**{**asdict(spike), "snapshot": self._snapshot_at[1]})
        self.found.append(spike)
        logger.warning("tbmem spike at step %d: %s", spike.step, spike.describe())
        emit = self.emit
        if emit is None:
            return
        lines = [f"**Spike** at step {spike.step}: {spike.describe()}."]
        if spike.snapshot:
            lines += ["", "Snapshot written: " + ", ".join(f"`{p}`" for p in spike.snapshot)]
        elif cfg.snapshot:
            lines += ["", "No snapshot could be written (see the tbmem log)."]
        if len(self.found) == cfg.max_spikes:
            lines += ["", f"This is the run's {cfg.max_spikes}th spike (max_spikes): later ones are not reported."]
        emit.add_text(SPIKES_TEXT_TAG, "\n".join(lines), spike.step)
        self._append(emit, spike)
        emit.flush()  # rare: the entry is in the file before the run can end badly

    def _append(self, emit: Emitter, spike: Spike) -> None:
        log_dir = emit.log_dir
        try:
            append_spike(log_dir, spike.to_json())
        except OSError as exc:
            emit.faults.failed(os.path.dirname(spikes_log_path(log_dir)), exc, events=1)


def _number(value: Any) -> float:
    item = getattr(value, "item", None)  # a 0-d tensor or numpy scalar (add_scalar accepts both)
    return float(item() if callable(item) else value)
