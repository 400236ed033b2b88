"""Runs side by side: peaks, step time, census cost and the census at aligned points, with differences.

:func:`compare` takes the scalars of two or more runs (a frame of :func:`tbmem.analysis.load_scalars`)
and lays them out as rows, one value per run, and the difference of each run from the first (``B-A``,
with its sign). Runs are aligned one of two ways:

* ``"step"``: every run recorded the same steps (the same model at two widths, the same loop on two
  machines): the census is compared at the same steps, the first, middle and last census step the runs
  share;
* ``"phase"``: runs of different lengths (a heat and a Burgers model, 6 and 72 records): each run's
  census nearest to the start, the middle and the end of its own census steps.

``align="auto"`` picks ``"step"`` when every run's records cover the same steps and every run with a
census took it at the same steps, else ``"phase"``. Every number is a value of the event files (a peak
is the largest record, a step time statistic is over the records of ``Perf/step_time_ms``, a census
value is the tag's value at that step); a category, module or dtype a census did not log is 0 there.

Example:
    >>> import tempfile
    >>> from tbmem import MemoryWriter
    >>> from tbmem.analysis import load_scalars
    >>> from tbmem._internal.analysis.compare import compare
    >>> logdir = tempfile.mkdtemp()
    >>> for run, mb in (("small", 1.0), ("wide", 4.0)):
    ...     with MemoryWriter(f"{logdir}/{run}", custom_layout=False) as w:
    ...         for step in (0, 10, 20):
    ...             w.write_scalars({"Memory/RAM/process_rss_GB": 0.5,
    ...                              "Memory/Tensor_Category/parameters_MB": mb}, step)
    >>> c = compare(load_scalars(logdir))
    >>> c.align, c.row("census at end", "parameters").values, c.row("census at end", "parameters").diffs
    ('step', [1.0, 4.0], [3.0])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from tbmem._internal.analysis.summary import CATEGORIES, CATEGORY_PREFIX, RunSummary, summarize
from tbmem._internal.tags import TAGS

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = ["Row", "Comparison", "compare", "POINTS", "ALIGNS", "LABELS"]

#: The aligned points: name and fraction of the run's census steps.
POINTS = (("start", 0.0), ("middle", 0.5), ("end", 1.0))
ALIGNS = ("auto", "step", "phase")
#: Runs are named A, B, C, ... in the table (their names are listed above it).
LABELS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_BREAKDOWNS = (("module", "census_module"), ("dtype", "census_dtype"))
_TOTAL = TAGS["census_total"].tag


@dataclass(frozen=True)
class Row:
    """One metric of every run.

    Attributes:
        section: The group it is shown in (``memory``, ``speed``, ``census at end``, ...).
        metric: What it is (``peak RAM RSS``, ``parameters``, ``module unet.down``, ...).
        kind: How it is shown: ``gb``/``mb`` (the tags' units), ``ms``, ``pct``, ``count``, ``text``.
        values: One per run, None where the run has none.
    """

    section: str
    metric: str
    kind: str
    values: list[Any]

    @property
    def diffs(self) -> list[float | None]:
        """Each later run minus the first (None where either is missing or the row is text)."""
        first = self.values[0]
        return [None if self.kind == "text" or first is None or v is None else float(v) - float(first)
                for v in self.values[1:]]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict, the differences included."""
        return {"section": self.section, "metric": self.metric, "kind": self.kind, "values": list(self.values),
                "diffs": self.diffs}


@dataclass(frozen=True)
class Comparison:
    """What :func:`compare` returns: the runs, how they were aligned, the rows."""

    runs: list[str]
    align: str
    points: list[dict[str, Any]]
    rows: list[Row] = field(default_factory=list)

    @property
    def labels(self) -> list[str]:
        """``A``, ``B``, ... in the order of :attr:`runs`."""
        return [LABELS[i] for i in range(len(self.runs))]

    def row(self, section: str, metric: str) -> Row:
        """The row named so (KeyError when there is none)."""
        for r in self.rows:
            if r.section == section and r.metric == metric:
                return r
        raise KeyError(f"no row {metric!r} in section {section!r}")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict."""
        return {"align": self.align, "runs": [{"label": lab, "run": r} for lab, r in zip(self.labels, self.runs)],
                "points": self.points, "rows": [r.to_dict() for r in self.rows]}


def _census_steps(run_df: "pd.DataFrame") -> list[int]:
    sel = run_df[(run_df["tag"] == _TOTAL) | run_df["tag"].str.startswith(CATEGORY_PREFIX)]
    return sorted(int(s) for s in sel["step"].unique())


def _record_steps(run_df: "pd.DataFrame") -> list[int]:
    return sorted(int(s) for s in run_df.loc[run_df["tag"].str.startswith("Memory/"), "step"].unique())


def _nearest(steps: Sequence[int], target: float) -> int:
    return min(steps, key=lambda s: (abs(s - target), s))


def _points(census: dict[str, list[int]], runs: list[str], align: str) -> list[dict[str, Any]]:
    with_census = [r for r in runs if census[r]]
    points = []
    if align == "step" and with_census:
        shared = sorted(set.intersection(*(set(census[r]) for r in with_census)))
        if not shared:
            raise ValueError("align='step': the runs' censuses share no step; use align='phase'")
    for name, fraction in POINTS:
        steps: dict[str, int | None] = {}
        for r in runs:
            own = shared if align == "step" and census[r] else census[r]
            steps[r] = own[round(fraction * (len(own) - 1))] if align == "step" and own else (
                _nearest(own, own[0] + fraction * (own[-1] - own[0])) if own else None)
        points.append({"name": name, "fraction": fraction, "steps": steps})
    return points


def _value(run_df: "pd.DataFrame", tag: str, step: int) -> float | None:
    hit = run_df[(run_df["tag"] == tag) & (run_df["step"] == step)]["value"]
    return None if hit.empty else float(hit.iloc[-1])


def _census_rows(section: str, frames: dict[str, "pd.DataFrame"], runs: list[str], at: dict[str, int | None]
                 ) -> list[Row]:
    rows = [Row(section, "step", "text", [None if at[r] is None else str(at[r]) for r in runs])]

    def values(tag_of: Any) -> list[float | None]:
        out: list[float | None] = []
        for r in runs:
            step = at[r]
            v = None if step is None else _value(frames[r], tag_of, step)
            out.append(0.0 if v is None and step is not None else v)  # a census that found none logs none
        return out

    rows.append(Row(section, "total", "mb", values(_TOTAL)))
    names: dict[str, set[str]] = {"category": set(), **{b: set() for b, _ in _BREAKDOWNS}}
    prefixes = {"category": CATEGORY_PREFIX, **{b: TAGS[k].tag.partition("{name}")[0] for b, k in _BREAKDOWNS}}
    for r in runs:
        if at[r] is None:
            continue
        df = frames[r]
        tags = df.loc[(df["step"] == at[r]) & df["tag"].str.endswith("_MB"), "tag"].unique()
        for b, prefix in prefixes.items():
            names[b].update(str(t)[len(prefix):-3] for t in tags if str(t).startswith(prefix))
    order = {c: i for i, c in enumerate(CATEGORIES)}
    for cat in sorted(names["category"], key=lambda c: (order.get(c, len(order)), c)):
        rows.append(Row(section, cat, "mb", values(f"{CATEGORY_PREFIX}{cat}_MB")))
    for b, _ in _BREAKDOWNS:
        for name in sorted(names[b]):
            rows.append(Row(section, f"{b} {name}", "mb", values(f"{prefixes[b]}{name}_MB")))
    return rows


def _count(run_df: "pd.DataFrame", key: str) -> float | None:
    n = int((run_df["tag"] == TAGS[key].tag).sum())
    return float(n) if n else None


def _summary_rows(summaries: list[RunSummary], frames: dict[str, "pd.DataFrame"], runs: list[str]) -> list[Row]:
    def get(fn: Any) -> list[Any]:
        return [fn(s) for s in summaries]

    rows = [Row("run", "steps", "text", get(lambda s: f"{s.first_step}..{s.last_step}")),
            Row("run", "records", "count", get(lambda s: float(s.records))),
            Row("memory", "peak VRAM allocated", "gb", get(lambda s: s.peak_allocated_gb)),
            Row("memory", "peak VRAM reserved", "gb", get(lambda s: s.peak_reserved_gb)),
            Row("memory", "peak RAM RSS", "gb", get(lambda s: s.peak_rss_gb)),
            Row("memory", "peak process tree RSS", "gb", get(lambda s: s.peak_tree_rss_gb))]
    for stat in ("mean", "median", "p95", "max"):
        rows.append(Row("speed", f"step time {stat}", "ms", get(lambda s, k=stat: (s.step_time_ms or {}).get(k))))
    rows += [Row("speed", "censuses", "count", get(lambda s: (s.census_cost or {}).get("censuses"))),
             Row("speed", "census median", "ms", get(lambda s: (s.census_cost or {}).get("median_ms"))),
             Row("speed", "census share of the run", "pct", get(lambda s: (s.census_cost or {}).get("percent"))),
             Row("L-BFGS-B", "iterations", "count", [_count(frames[r], "iteration_loss") for r in runs]),
             Row("L-BFGS-B", "loss evaluations", "count", [_count(frames[r], "eval_loss") for r in runs])]
    return rows


def compare(df: "pd.DataFrame", runs: Sequence[str] | None = None, *, align: str = "auto") -> Comparison:
    """Compare ``runs`` (default: every run of ``df`` with memory tags, by name) of a frame of
    :func:`tbmem.analysis.load_scalars`; see the module docstring.

    Raises:
        ValueError: fewer than two runs, an unknown ``align``, or ``"step"`` for runs whose censuses
            share no step.
        NoTbmemTagsError: a run has no ``Memory/*`` tag.
    """
    if align not in ALIGNS:
        raise ValueError(f"align must be one of {', '.join(ALIGNS)}, got {align!r}")
    summaries = summarize(df, runs=runs)
    names = [s.run for s in summaries]
    if len(names) < 2:
        raise ValueError(f"compare needs at least two runs with memory tags, got {len(names)}")
    if len(names) > len(LABELS):
        raise ValueError(f"compare takes at most {len(LABELS)} runs, got {len(names)}")
    frames = {str(r): g for r, g in df[df["run"].isin(names)].groupby("run", sort=False)}
    census = {r: _census_steps(frames[r]) for r in names}
    if align == "auto":
        spans = {(rs[0], rs[-1], len(rs)) for rs in (_record_steps(frames[r]) for r in names)}
        shared = {tuple(c) for c in census.values() if c}
        align = "step" if len(spans) == 1 and len(shared) <= 1 else "phase"
    points = _points(census, names, align)
    rows = _summary_rows(summaries, frames, names)
    for p in points:
        rows += _census_rows(f"census at {p['name']}", frames, names, p["steps"])
    rows = [r for r in rows if any(v is not None for v in r.values)]
    if not any(census.values()):
        points = []
    return Comparison(runs=names, align=align, points=points, rows=rows)
