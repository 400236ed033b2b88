"""Loss spikes of each run with the memory change around them, for ``tbmem report``.

A run whose writer had the spike detector on (``MemoryWriter(spikes=...)``) lists what it found
online, from its side file :data:`tbmem._internal.logdir.layout.SPIKES_LOG` (with the snapshot written then); a
run without that file is checked here with the same rule and its defaults
(:class:`tbmem._internal.spikes.SpikeDetector`) over its event files. For each spike the memory records
around it are compared: the last record before the spike's step and the record at that step (or
the first after it), for RSS, peak RSS (the window's peak, with ``peak_mode="window"``: what the
step between the two records reached) and, on CUDA runs, allocated and peak allocated VRAM.

Example:
    >>> import tempfile
    >>> from tbmem import MemoryWriter
    >>> from tbmem.analysis import load_scalars
    >>> from tbmem._internal.analysis.spikes import find_spikes
    >>> logdir = tempfile.mkdtemp()
    >>> with MemoryWriter(f"{logdir}/run", custom_layout=False) as w:
    ...     for step in range(30):
    ...         w.write_scalars({"Loss/batch": 9.0 if step == 20 else 1.0,
    ...                          "Memory/RAM/process_rss_GB": 2.0 if step >= 20 else 1.0}, step)
    >>> (s,) = find_spikes(load_scalars(logdir), logdir)
    >>> s.step, s.source, s.memory[0]["label"], s.memory[0]["delta"]
    (20, 'report', 'RSS', 1.0)
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from tbmem._internal.logdir.spikes import read_spikes
from tbmem._internal.spikes import SpikeConfig, SpikeDetector
from tbmem._internal.tags import TAGS, loss_tags

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = ["SpikeFinding", "find_spikes", "format_spikes", "MEMORY_AROUND"]

#: The memory readings compared around a spike: (label, tag-table key).
MEMORY_AROUND = (("RSS", "ram_rss"), ("peak RSS", "ram_peak_rss"), ("VRAM allocated", "vram_allocated"),
                 ("VRAM peak allocated", "vram_peak_allocated"))


@dataclass(frozen=True)
class SpikeFinding:
    """One spike of a run and the memory around it (memory in GB, the tags' unit).

    Attributes:
        run: The run's name.
        tag, step, value, median, ratio, kind: As :class:`tbmem._internal.spikes.Spike`.
        source: ``"online"`` (the writer's detector, from the side file) or ``"report"`` (found here).
        snapshot: Paths of the snapshot written at the spike (online only).
        memory: Per reading: ``label``, ``tag``, ``before_step``, ``before``, ``after_step``, ``after``,
            ``delta`` (after - before, GB).
    """

    run: str
    tag: str
    step: int
    value: float
    median: float | None
    ratio: float | None
    kind: str
    source: str
    snapshot: list[str] = field(default_factory=list)
    memory: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict."""
        return asdict(self)

    def describe(self) -> str:
        """One line: the spike, the memory around it, the snapshot."""
        from tbmem._internal.analysis.table import format_bytes

        if self.kind == "nonfinite":
            head = f"{self.tag} = {self.value} at step {self.step}"
        else:
            head = (f"{self.tag} = {self.value:.4g} at step {self.step}, {self.ratio:.3g}x its median "
                    f"{self.median:.4g}")
        parts = []
        for m in self.memory:
            gib = float(2**30)
            parts.append(f"{m['label']} {format_bytes(m['before'] * gib)} (step {m['before_step']}) -> "
                         f"{format_bytes(m['after'] * gib)} (step {m['after_step']}, "
                         f"{'+' if m['delta'] >= 0 else ''}{format_bytes(m['delta'] * gib)})")
        text = f"{self.run}: {head}"
        text += "; " + ", ".join(parts) if parts else "; no memory record around it"
        if self.snapshot:
            text += f"; snapshot {os.path.basename(self.snapshot[0])}"
        if self.source == "report":
            text += " (found by tbmem report)"
        return text


def _memory_around(run_df: "pd.DataFrame", step: int) -> list[dict[str, Any]]:
    out = []
    for label, key in MEMORY_AROUND:
        g = run_df[run_df["tag"] == TAGS[key].tag]
        if g.empty:
            continue
        before, after = g[g["step"] < step], g[g["step"] >= step]
        if before.empty or after.empty:
            continue
        b, a = before.iloc[-1], after.iloc[0]
        out.append({"label": label, "tag": TAGS[key].tag, "before_step": int(b["step"]),
                    "before": float(b["value"]), "after_step": int(a["step"]), "after": float(a["value"]),
                    "delta": float(a["value"]) - float(b["value"])})
    return out


def _offline(run_df: "pd.DataFrame", losses: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The default rule over the run's event files (what the online detector would have found), watching the
    run's loss tags (``losses``: its settings side file's) too."""
    detector = SpikeDetector(_config(losses))
    found = []
    for tag in sorted(t for t in run_df["tag"].unique() if detector.watches(t)):
        g = run_df[run_df["tag"] == tag]
        for step, value in zip(g["step"].tolist(), g["value"].tolist()):
            spike = detector.update(tag, int(step), float(value))
            if spike is not None:
                found.append(spike.to_json())
    return found


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float, str)) else math.nan


def find_spikes(df: "pd.DataFrame", logdir: str | os.PathLike[str], *, runs: Iterable[str] | None = None
                ) -> list[SpikeFinding]:
    """The spikes of every run of ``df`` (a frame of :func:`tbmem.analysis.load_scalars` of ``logdir``),
    ordered by run and step."""
    from tbmem._internal.analysis.load import find_runs
    from tbmem._internal.logdir.settings import read_settings

    dirs = {run: str(files[0].parent) for run, files in find_runs(logdir).items()}
    wanted = list(runs) if runs is not None else sorted(df["run"].unique())
    out = []
    for run in wanted:
        run_df = df[df["run"] == run].sort_values("step", kind="stable")
        recorded = read_spikes(dirs[run]) if run in dirs else []
        source = "online" if recorded or (run in dirs and _has_side_file(dirs[run])) else "report"
        spikes = recorded if source == "online" else _offline(
            run_df, read_settings(dirs[run]).loss_tags if run in dirs else ())
        for s in spikes:
            out.append(SpikeFinding(
                run=run, tag=s["tag"], step=int(s["step"]), value=_number(s.get("value")),
                median=s.get("median"), ratio=s.get("ratio"), kind=s.get("kind", "spike"), source=source,
                snapshot=list(s.get("snapshot") or []) if source == "online" else [],
                memory=_memory_around(run_df, int(s["step"]))))
    return sorted(out, key=lambda f: (wanted.index(f.run), f.step, f.tag))


def _has_side_file(run_dir: str) -> bool:
    from tbmem._internal.logdir.spikes import spikes_log_path

    return os.path.isfile(spikes_log_path(run_dir))


def format_spikes(findings: list[SpikeFinding]) -> str:
    """``LOSS SPIKES:`` and a line per spike, or a line saying none was found."""
    if not findings:
        cfg = _config()
        return (f"No loss spike: no watched scalar ({', '.join(cfg.tags)}) rose above {cfg.factor:g}x the median "
                f"of its last {cfg.window} values).")
    return "LOSS SPIKES:\n" + "\n".join(f"  {f.describe()}" for f in findings)


def _config(losses: Sequence[str] = ()) -> SpikeConfig:
    """The detector's defaults, with the loss tags of :func:`tbmem._internal.tags.loss_tags`: a run's own ``losses``, and
    ``TBMEM_LOSS_TAGS``'s."""
    base = SpikeConfig()
    return SpikeConfig(tags=tuple(dict.fromkeys((*loss_tags(losses), *base.tags))))
