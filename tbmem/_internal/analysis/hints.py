"""Hints: readings of a run turned into advice with numbers (what to change, what it saves).

:func:`find_hints` looks at each run of a logdir (its scalars, and the text entries
tbmem writes: the census's largest tensors, a forecast, the trainers' config):

* ``activation_checkpointing``: activations hold at least half the census at its peak;
  checkpointing in ``s`` segments keeps about ``2/s`` of them (estimate for ``s = 4``);
* ``optimizer_precision``: the bytes of optimizer state that are certainly float32 (the
  state minus every byte of another dtype), and what bfloat16 or 8-bit states save
  (these two only when they save at least ``min_saving_mb``, 10 MB);
* ``expandable_segments``: high fragmentation while the allocator retried allocations:
  ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` and the reserved bytes not in use;
* ``growing_other``: the census's ``other`` category grows steadily (a leak finding);
  the storages new in the largest-tensor tables between the window's first and last census;
* ``batch_headroom``: the largest batch size that still fits the device (from a logged
  forecast, else on CUDA from the peak and the batch size in use).

Needs the ``analysis`` extra (pandas); does not import torch (the TensorBoard plugin
shows these findings).

Example:
    >>> import tempfile
    >>> from tbmem import MemoryWriter
    >>> from tbmem._internal.analysis.hints import find_hints
    >>> logdir = tempfile.mkdtemp()
    >>> with MemoryWriter(logdir, custom_layout=False) as w:
    ...     w.write_scalars({"Memory/Tensor_Category/parameters_MB": 100.0,
    ...                      "Memory/Tensor_Category/activations_MB": 900.0,
    ...                      "Memory/Tensor_Census/total_MB": 1000.0}, step=5)
    >>> [(h.kind, h.saving_mb) for h in find_hints(logdir)]
    [('activation_checkpointing', 450.0)]
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Iterable

from tbmem._internal.analysis.headroom import headroom
from tbmem._internal.analysis.summary import RunSummary, summarize, tag_series, value_at
from tbmem._internal.analysis.table import format_bytes
from tbmem._internal.logdir.census_log import parse_census_markdown
from tbmem._internal.tags import TAGS

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = ["Hint", "find_hints", "format_hints", "HINT_KINDS"]

_SUBSCRIPT = re.compile(r"\[[^\[\]]*\]$")  # the last index of a name: kept[3] -> kept[...]

HINT_KINDS = ("activation_checkpointing", "optimizer_precision", "expandable_segments", "growing_other",
              "batch_headroom")
_DTYPE_PREFIX = "Memory/Tensor_DType/"
_CENSUS_TEXT = TAGS["census_text"].tag
_SEGMENTS = 4


@dataclass(frozen=True, kw_only=True)
class Hint:
    """One piece of advice for one run.

    Attributes:
        run: The run (path relative to the logdir).
        kind: One of :data:`HINT_KINDS`.
        title: A short headline.
        advice: What to change, with the expected effect in numbers.
        evidence: The readings the advice rests on.
        saving_mb: Expected memory saved, in MB (None where the hint saves nothing).
        step: The step the evidence comes from.
        data: The numbers, for programs (the TensorBoard plugin).

    Example:
        >>> Hint(run="r", kind="batch_headroom", title="t", advice="a", evidence="e").to_dict()["kind"]
        'batch_headroom'
    """

    run: str
    kind: str
    title: str
    advice: str
    evidence: str
    saving_mb: float | None = None
    step: int | None = None
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict."""
        return asdict(self)


def _b(mb: float) -> str:
    """An amount given in the tags' MB (2**20 bytes), in the binary unit that fits, as the report's
    table writes it (``12.3 KiB``, ``374 MiB``): one way of writing sizes in the whole report."""
    return format_bytes(mb * 2**20)


def _activations(s: RunSummary, min_saving_mb: float) -> Hint | None:
    mix, total = s.category_mb_at_peak, s.census_peak_total_mb
    acts = mix.get("activations", 0.0)
    saving = acts * (1 - 2 / _SEGMENTS)
    if not total or acts < 0.5 * total or saving < min_saving_mb:
        return None
    return Hint(
        run=s.run, kind="activation_checkpointing", step=s.census_peak_step, saving_mb=saving,
        title=f"activations are {acts / total:.0%} of tensor memory",
        advice=(f"Activation checkpointing (torch.utils.checkpoint) recomputes activations in the backward pass "
                f"instead of keeping them: checkpointing the network in {_SEGMENTS} segments keeps about "
                f"{2 / _SEGMENTS:.0%} of them, saving about {_b(saving)} ({_b(total)} -> {_b(total - saving)} "
                "at this census) for about one extra forward pass per step; more segments save more."),
        evidence=f"census at step {s.census_peak_step}: activations {_b(acts)} of {_b(total)}",
        data={"activations_mb": acts, "census_total_mb": total, "segments": _SEGMENTS})


def _optimizer(s: RunSummary, df: "pd.DataFrame", min_saving_mb: float) -> Hint | None:
    step, total = s.census_peak_step, s.census_peak_total_mb
    state = s.category_mb_at_peak.get("optimizer_state", 0.0)
    if step is None or not total or state < 0.1 * total:
        return None
    dtypes = {t[len(_DTYPE_PREFIX):-3]: v for t, v in
              df[(df["step"] == step) & df["tag"].str.startswith(_DTYPE_PREFIX)][["tag", "value"]].values}
    if "float32" not in dtypes:
        return None
    other_dtypes = sum(v for k, v in dtypes.items() if k != "float32")
    fp32_state = min(state - other_dtypes, dtypes["float32"])  # every byte of another dtype could be state
    if fp32_state <= 0.05 * state or fp32_state / 2 < min_saving_mb:
        return None
    return Hint(
        run=s.run, kind="optimizer_precision", step=step, saving_mb=fp32_state / 2,
        title=f"at least {_b(fp32_state)} of optimizer state is float32",
        advice=(f"Keeping the optimizer state in bfloat16 would save {_b(fp32_state / 2)}; 8-bit states "
                f"(bitsandbytes' Adam8bit, for example) about {_b(fp32_state * 3 / 4)}. Check convergence: "
                "low-precision moments need care (stochastic rounding, a float32 master copy)."),
        evidence=(f"census at step {step}: optimizer state {_b(state)}; all tensors of dtypes other than "
                  f"float32 hold {_b(other_dtypes)}, so at least {_b(fp32_state)} of the state is float32"),
        data={"optimizer_state_mb": state, "float32_lower_bound_mb": fp32_state, "other_dtypes_mb": other_dtypes})


def _fragmentation(s: RunSummary, df: "pd.DataFrame") -> Hint | None:
    frag, retries = tag_series(df, "Memory/fragmentation_percent"), tag_series(df, "Memory/GPU/vram_alloc_retries")
    if frag is None or retries is None:
        return None
    rose = float(retries["value"].max() - retries["value"].iloc[0])
    i = frag["value"].to_numpy().argmax()
    worst, step = float(frag["value"].iloc[i]), int(frag["step"].iloc[i])
    if worst < 30.0 or float(retries["value"].max()) <= 0:
        return None
    reserved = value_at(df, "Memory/GPU/vram_reserved_GB", step)
    allocated = value_at(df, "Memory/GPU/vram_allocated_GB", step)
    idle = (reserved - allocated) * 1024 if reserved is not None and allocated is not None else None
    idle_text = f"{_b(idle)} reserved but not holding tensors" if idle is not None else "memory reserved unused"
    return Hint(
        run=s.run, kind="expandable_segments", step=step, saving_mb=idle,
        title=f"fragmentation {worst:.1f}% with {float(retries['value'].max()):.0f} allocation retries",
        advice=("Start the process with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: segments then grow in "
                f"place instead of splitting into blocks of the wrong size; up to {idle_text} at step {step} "
                "could hold tensors again, and the retries (each a cache flush and a synchronisation) stop."),
        evidence=(f"fragmentation {worst:.1f}% at step {step} ({idle_text}); alloc retries rose by {rose:.0f} "
                  f"to {float(retries['value'].max()):.0f}"),
        data={"fragmentation_percent": worst, "idle_mb": idle, "retries": float(retries["value"].max()),
              "retries_rise": rose})


def _tables(texts: "pd.DataFrame | None", run: str) -> dict[int, list[dict[str, Any]]]:
    if texts is None or texts.empty:
        return {}
    out: dict[int, list[dict[str, Any]]] = {}
    for step, text in texts[(texts["run"] == run) & (texts["tag"] == _CENSUS_TEXT)][["step", "value"]].values:
        # the table as the Memory tab reads it (bytes from its MB column, rounded to 0.001 MB)
        out[int(step)] = [{**r, "mb": r["bytes"] / 2**20, "shape": "x".join(map(str, r["shape"])) or "scalar"}
                          for r in parse_census_markdown(str(text))]
    return out


def _growing(s: RunSummary, texts: "pd.DataFrame | None") -> Hint | None:
    finding = next((f for f in s.leaks if f.category == "other"), None)
    if finding is None:
        return None
    tables = _tables(texts, s.run)
    first = [t for t in sorted(tables) if t >= finding.start_step]
    last = [t for t in sorted(tables) if t <= finding.end_step]
    new: list[dict[str, Any]] = []
    if first and last and last[-1] > first[0]:
        # not by name: a name is what holds the tensor (``kept[3]``) when the census found it, else its type
        before = [(r["shape"], r["dtype"], r["device"]) for r in tables[first[0]] if r["category"] == "other"]
        for r in tables[last[-1]]:
            key = (r["shape"], r["dtype"], r["device"])
            if r["category"] != "other":
                continue
            if key in before:
                before.remove(key)
            else:
                new.append(r)
    if new:
        listed = "; ".join(f"`{r['name']}` {r['shape']} {r['dtype']} on {r['device']} ({_b(r['mb'])})"
                           for r in new[:8])
        where = (f"Storages in the census's largest-tensor table at step {last[-1]} that were not there at step "
                 f"{first[0]}: {listed}" + (f" and {len(new) - 8} more" if len(new) > 8 else "") + ".")
    else:
        where = _crowded(tables[last[-1]] if last else [])
    growth = finding.end_mb - finding.start_mb
    return Hint(
        run=s.run, kind="growing_other", step=finding.end_step, saving_mb=growth,
        title=f"'other' tensors grow {finding.slope_mb_per_1k:+.1f} MB/1k steps",  # as LEAKS and the threshold
        advice=("Something keeps tensors alive from step to step (a list of losses kept as tensors instead of "
                f".item(), a cache, outputs stored for later). {where}"),
        evidence=finding.describe(),
        data={"slope_mb_per_1k": finding.slope_mb_per_1k, "growth_mb": growth,
              "new_storages": new})


def _crowded(rows: list[dict[str, Any]]) -> str:
    """What to say when no new storage shows: one shape filling the table is the likely culprit."""
    from collections import Counter

    other = [(r["shape"], r["dtype"], r["device"], r["mb"]) for r in rows if r["category"] == "other"]
    if other:
        (shape, dtype, device, mb), count = Counter(other).most_common(1)[0]
        if count >= 3 and count * 2 >= len(rows):
            # rows named by what holds them (kept[0], kept[1], ...) are one holder: `kept[...]`
            names = Counter(_SUBSCRIPT.sub("[...]", r["name"]) for r in rows if r["category"] == "other" and
                            (r["shape"], r["dtype"], r["device"], r["mb"]) == (shape, dtype, device, mb))
            name = names.most_common(1)[0][0]
            return (f"The census's largest-tensor table is full of `{name}` {shape} {dtype} on {device} "
                    f"({_b(mb)} each, {count} of its {len(rows)} rows): many storages of that shape are "
                    "alive, most likely the ones that accumulate.")
    return ("No new storage among the census's largest tensors: the growth is in smaller tensors; raise "
            "top_k or write a memory snapshot to see them.")


def _headroom(s: RunSummary, df: "pd.DataFrame", texts: "pd.DataFrame | None",
              batch_size: int | None) -> Hint | None:
    fields = headroom(s, df, texts, batch_size)
    return None if fields is None else Hint(run=s.run, kind="batch_headroom", saving_mb=None, **fields)


def find_hints(data: "pd.DataFrame | str | os.PathLike[str]", *, texts: "pd.DataFrame | None" = None,
               summaries: Iterable[RunSummary] | None = None, runs: Iterable[str] | None = None,
               batch_size: int | None = None, min_saving_mb: float = 10.0, on_error: str = "raise") -> list[Hint]:
    """Advice for every run with tbmem memory tags.

    Args:
        data: A logdir, or a DataFrame from :func:`tbmem.analysis.load_scalars`.
        texts: Text entries (:func:`tbmem.analysis.load_texts`); read from the logdir when
            ``data`` is one, else the hints that need them are skipped.
        summaries: :func:`summarize`'s result for ``data``, when already computed.
        runs: Only these runs.
        batch_size: The batch size in use (else read from a logged forecast or the
            trainers' ``config`` text), for the headroom hint.
        min_saving_mb: Advice that would save less than this is not given (checkpointing
            a few MB of activations is not worth a slower step).
        on_error: Passed to the loaders when ``data`` is a logdir.

    Returns:
        Hints by run, in the order of :data:`HINT_KINDS`.
    """
    if isinstance(data, (str, os.PathLike)):
        from tbmem._internal.analysis.load import load_scalars, load_texts

        if texts is None:
            texts = load_texts(data, runs=runs, on_error=on_error)
        data = load_scalars(data, runs=runs, on_error=on_error)
    if summaries is None:
        summaries = summarize(data, runs=runs)
    groups = {str(r): g for r, g in data.groupby("run", sort=False)}
    out: list[Hint] = []
    for s in summaries:
        df = groups.get(s.run)
        if df is None:
            continue
        found = [_activations(s, min_saving_mb), _optimizer(s, df, min_saving_mb), _fragmentation(s, df),
                 _growing(s, texts), _headroom(s, df, texts, batch_size)]
        out += [h for h in found if h is not None]
    return out


def format_hints(hints: Iterable[Hint]) -> str:
    """The hints as console text, one block per hint, or a line saying there are none."""
    hints = list(hints)
    if not hints:
        return "No hints: nothing in the readings calls for a change."
    lines = ["HINTS:"]
    for h in hints:
        lines += [f"  {h.run}: {h.title} [{h.kind}]", f"    {h.advice}", f"    evidence: {h.evidence}"]
    return "\n".join(lines)

