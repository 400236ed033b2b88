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

from tbmem._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "load_scalars": "tbmem.analysis.load",
    "load_texts": "tbmem.analysis.load",
    "load_scalars_and_texts": "tbmem.analysis.load",
    "find_runs": "tbmem.analysis.load",
    "run_loss_tags": "tbmem.analysis.load",
    "AnalysisError": "tbmem.analysis.load",
    "LogdirNotFoundError": "tbmem.analysis.load",
    "NoEventFilesError": "tbmem.analysis.load",
    "NoTbmemTagsError": "tbmem.analysis.load",
    "CorruptEventFileError": "tbmem.analysis.load",
    "detect_leaks": "tbmem.analysis.leaks",
    "LeakFinding": "tbmem.analysis.leaks",
    "theil_sen": "tbmem.trend",
    "summarize": "tbmem.analysis.summary",
    "RunSummary": "tbmem.analysis.summary",
    "rank_jobs": "tbmem.analysis.ranks",
    "RankJob": "tbmem.analysis.ranks",
    "RankMetric": "tbmem.analysis.ranks",
    "format_rank_jobs": "tbmem.analysis.ranks",
    "format_table": "tbmem.analysis.table",
    "format_leaks": "tbmem.analysis.table",
    "plot_timeline": "tbmem.analysis.plot",
    "plot_stacked": "tbmem.analysis.plot",
    "plot_lines": "tbmem.analysis.plot",
    "plot_readings": "tbmem.analysis.figures",
    "plot_large_tensors": "tbmem.analysis.figures",
    "plot_loss_and_memory": "tbmem.analysis.loss",
    "memory_spikes": "tbmem.analysis.loss",
    "Comparison": "tbmem.analysis.compare",
    "plot_comparison": "tbmem.analysis.compare_plot",
    "find_spikes": "tbmem.analysis.spikes",
    "SpikeFinding": "tbmem.analysis.spikes",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # pragma: no cover
    from tbmem.analysis.compare import Comparison
    from tbmem.analysis.compare_plot import plot_comparison
    from tbmem.analysis.figures import plot_large_tensors, plot_readings
    from tbmem.analysis.leaks import LeakFinding, detect_leaks
    from tbmem.analysis.load import (AnalysisError, CorruptEventFileError, LogdirNotFoundError,
                                     NoEventFilesError, NoTbmemTagsError, find_runs, load_scalars,
                                     load_scalars_and_texts, load_texts, run_loss_tags)
    from tbmem.analysis.loss import memory_spikes, plot_loss_and_memory
    from tbmem.analysis.plot import plot_lines, plot_stacked, plot_timeline
    from tbmem.analysis.ranks import RankJob, RankMetric, format_rank_jobs, rank_jobs
    from tbmem.analysis.spikes import SpikeFinding, find_spikes
    from tbmem.analysis.summary import RunSummary, summarize
    from tbmem.analysis.table import format_leaks, format_table
    from tbmem.trend import theil_sen


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
