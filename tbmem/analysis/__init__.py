"""Analysis of tbmem logdirs: scalars into pandas, leak detection, per-run summaries, figures.

Needs the ``analysis`` extra (pandas, matplotlib): ``pip install 'tbmem[analysis]'``.
Names are imported lazily, so ``import tbmem.analysis`` works without them and
the missing extra is named when a function needs it.

Example:
    >>> import tempfile
    >>> from tbmem import MemoryWriter
    >>> from tbmem.analysis import summarize
    >>> logdir = tempfile.mkdtemp()
    >>> with MemoryWriter(logdir, custom_layout=False) as w:
    ...     w.write_scalars({"Memory/RAM/process_rss_GB": 2.0}, step=0)
    >>> summarize(logdir)[0].peak_rss_gb
    2.0
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tbmem._internal._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "load_scalars": "tbmem._internal.analysis.load",
    "load_texts": "tbmem._internal.analysis.load",
    "load_scalars_and_texts": "tbmem._internal.analysis.load",
    "find_runs": "tbmem._internal.analysis.load",
    "run_loss_tags": "tbmem._internal.analysis.load",
    "AnalysisError": "tbmem._internal.analysis.load",
    "LogdirNotFoundError": "tbmem._internal.analysis.load",
    "NoEventFilesError": "tbmem._internal.analysis.load",
    "NoTbmemTagsError": "tbmem._internal.analysis.load",
    "CorruptEventFileError": "tbmem._internal.analysis.load",
    "detect_leaks": "tbmem._internal.analysis.leaks",
    "LeakFinding": "tbmem._internal.analysis.leaks",
    "theil_sen": "tbmem._internal.trend",
    "summarize": "tbmem._internal.analysis.summary",
    "RunSummary": "tbmem._internal.analysis.summary",
    "rank_jobs": "tbmem._internal.analysis.ranks",
    "RankJob": "tbmem._internal.analysis.ranks",
    "RankMetric": "tbmem._internal.analysis.ranks",
    "format_rank_jobs": "tbmem._internal.analysis.ranks",
    "format_table": "tbmem._internal.analysis.table",
    "format_leaks": "tbmem._internal.analysis.table",
    "plot_timeline": "tbmem._internal.analysis.plot",
    "plot_stacked": "tbmem._internal.analysis.plot",
    "plot_lines": "tbmem._internal.analysis.plot",
    "plot_readings": "tbmem._internal.analysis.figures",
    "plot_large_tensors": "tbmem._internal.analysis.figures",
    "plot_loss_and_memory": "tbmem._internal.analysis.loss",
    "memory_spikes": "tbmem._internal.analysis.loss",
    "Comparison": "tbmem._internal.analysis.compare",
    "plot_comparison": "tbmem._internal.analysis.compare_plot",
    "find_spikes": "tbmem._internal.analysis.spikes",
    "SpikeFinding": "tbmem._internal.analysis.spikes",
    # what docs/ and the notebook show users calling (issue 36: their modules are tbmem's own now)
    "compare": "tbmem._internal.analysis.compare",
    "find_hints": "tbmem._internal.analysis.hints",
    "Hint": "tbmem._internal.analysis.hints",
    "LogdirReader": "tbmem._internal.logdir",
    "fit_unit": "tbmem._internal.analysis.axes",
    "wide": "tbmem._internal.analysis.plot",
    "format_bytes": "tbmem._internal.analysis.table",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # pragma: no cover
    from tbmem._internal.analysis.axes import fit_unit
    from tbmem._internal.analysis.compare import Comparison, compare
    from tbmem._internal.analysis.compare_plot import plot_comparison
    from tbmem._internal.analysis.figures import plot_large_tensors, plot_readings
    from tbmem._internal.analysis.hints import Hint, find_hints
    from tbmem._internal.analysis.leaks import LeakFinding, detect_leaks
    from tbmem._internal.analysis.load import (AnalysisError, CorruptEventFileError, LogdirNotFoundError,
                                               NoEventFilesError, NoTbmemTagsError, find_runs, load_scalars,
                                               load_scalars_and_texts, load_texts, run_loss_tags)
    from tbmem._internal.analysis.loss import memory_spikes, plot_loss_and_memory
    from tbmem._internal.analysis.plot import plot_lines, plot_stacked, plot_timeline, wide
    from tbmem._internal.analysis.ranks import RankJob, RankMetric, format_rank_jobs, rank_jobs
    from tbmem._internal.analysis.spikes import SpikeFinding, find_spikes
    from tbmem._internal.analysis.summary import RunSummary, summarize
    from tbmem._internal.analysis.table import format_bytes, format_leaks, format_table
    from tbmem._internal.logdir import LogdirReader
    from tbmem._internal.trend import theil_sen


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
