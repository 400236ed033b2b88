"""Read a TensorBoard logdir into a pandas DataFrame with TensorBoard's own event loading.

The reading is the logdir reader's (:mod:`tbmem._internal.logdir`): runs are found by
:func:`tbmem._internal.logdir.runs.find_runs` (a folder that directly holds event files, named by its
path below the logdir; the logdir itself by its folder), records read by
:mod:`tbmem._internal.logdir.events`, which checks that they account for every byte of a file (a damaged
file is reported, not silently cut short) and reads tags renamed since under their current
names. This module makes DataFrames of them, with a progress bar for many files.

Example:
    >>> import tempfile
    >>> from tbmem import MemoryWriter
    >>> from tbmem.analysis import load_scalars
    >>> logdir = tempfile.mkdtemp()
    >>> with MemoryWriter(f"{logdir}/run_a", every=1, custom_layout=False) as w:
    ...     w.write_scalars({"Memory/RAM/process_rss_GB": 1.5}, step=3)
    >>> load_scalars(logdir)[["run", "tag", "step", "value"]].values.tolist()
    [['run_a', 'Memory/RAM/process_rss_GB', 3, 1.5]]
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, Iterable

from tbmem._internal._extras import require
from tbmem._internal.logdir.errors import (AnalysisError, CorruptEventFileError, LogdirNotFoundError, NoEventFilesError,
                                 NoTbmemTagsError)
from tbmem._internal.logdir.events import (CPU_EPOCH_TAG, GPU_TAG_PREFIXES, OLD_EPOCH_TAG, EventFile, event_files,
                                 read_columns)
from tbmem._internal.logdir.runs import find_runs
from tbmem._internal.tags import current_tag

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

# the errors and find_runs are the logdir reader's (tbmem._internal.logdir), here where the analysis API has them
__all__ = [
    "AnalysisError",
    "LogdirNotFoundError",
    "NoEventFilesError",
    "NoTbmemTagsError",
    "CorruptEventFileError",
    "find_runs",
    "load_scalars",
    "load_texts",
    "load_scalars_and_texts",
    "run_loss_tags",
    "PROGRESS_MIN_FILES",
]

#: Show a progress bar (tqdm, on stderr) from this many event files on, when ``progress=None``.
PROGRESS_MIN_FILES = 20


def run_loss_tags(logdir: str | os.PathLike[str], runs: Iterable[str] | None = None) -> dict[str, tuple[str, ...]]:
    """Run -> the patterns of its loss tags: the built-in ones, those its writers recorded (its settings side
    file: ``MemoryWriterConfig.loss_tags``), this process's ``TBMEM_LOSS_TAGS`` (``loss_tags`` in tbmem/_internal/tags.py).

    Example:
        >>> import tempfile
        >>> from tbmem import MemoryWriter
        >>> logdir = tempfile.mkdtemp()
        >>> MemoryWriter(f"{logdir}/a", loss_tags=["train/ce_loss"], census_every=0).close()
        >>> run_loss_tags(logdir)["a"][-1]
        'train/ce_loss'
    """
    from tbmem._internal.logdir.reader import LogdirReader

    reader = LogdirReader(logdir)
    return {run: reader.loss_tags(run) for run in (reader.runs() if runs is None else runs)}


def _iter_files(files: list[EventFile], progress: bool | None) -> Iterable[EventFile]:
    show = len(files) >= PROGRESS_MIN_FILES if progress is None else progress
    if not show:
        return files
    try:
        from tqdm import tqdm  # plain text bar: tqdm.auto wants ipywidgets in notebooks
    except ImportError:  # progress is a nicety: without tqdm, read quietly
        return files
    return tqdm(files, desc="reading event files", unit="file", file=sys.stderr)


def _read(logdir: str | os.PathLike[str], *, runs: Iterable[str] | None, progress: bool | None,
          on_error: str, scalars: bool = True, texts: bool = True) -> "tuple[pd.DataFrame, pd.DataFrame]":
    """The scalars and the texts under ``logdir``, from one pass over its event files."""
    pd = require("pandas", extra="analysis")
    if on_error not in ("raise", "warn"):
        raise ValueError(f"on_error must be 'raise' or 'warn', got {on_error!r}")
    numbers, words = read_columns(_iter_files(event_files(logdir, runs), progress), on_error=on_error,
                                  scalars=scalars, texts=texts)
    return _frame(pd, numbers, "float64"), _frame(pd, words, object)


def _frame(pd: Any, cols: dict[str, list[Any]], value_type: Any) -> "pd.DataFrame":
    df = pd.DataFrame(cols).astype({"run": str, "tag": str, "step": "int64", "wall_time": "float64",
                                    "value": value_type})
    if value_type is not object:
        df = _current_names(df)
    # A run restarted in the same directory rewrites steps: keep the latest write of each
    # (run, tag, step), as TensorBoard's purge of orphaned data does.
    df = df.sort_values("wall_time", kind="stable").drop_duplicates(["run", "tag", "step"], keep="last")
    return df.sort_values(["run", "tag", "step"], kind="stable").reset_index(drop=True)


def _current_names(df: "pd.DataFrame") -> "pd.DataFrame":
    """Logs written before tbmem 0.2 renamed its tags read under the current names
    (:func:`tbmem._internal.logdir.events.current_name`, vectorised)."""
    names = {t: current_tag(t) for t in df["tag"].unique()}
    if all(k == v for k, v in names.items()):
        return df
    gpu_runs = set(df.loc[df["tag"].str.startswith(GPU_TAG_PREFIXES), "run"])
    cpu_epoch = (df["tag"] == OLD_EPOCH_TAG) & ~df["run"].isin(gpu_runs)
    df = df.assign(tag=df["tag"].map(names))
    df.loc[cpu_epoch, "tag"] = CPU_EPOCH_TAG
    return df


def load_scalars(logdir: str | os.PathLike[str], *, runs: Iterable[str] | None = None,
                 progress: bool | None = None, on_error: str = "raise") -> "pd.DataFrame":
    """Every scalar of every run under ``logdir`` as a long DataFrame.

    Args:
        logdir: A TensorBoard logdir (a run directory or a folder of runs).
        runs: Only these runs (names as returned by :func:`find_runs`).
        progress: Show a tqdm bar on stderr; None shows one from
            :data:`PROGRESS_MIN_FILES` event files on.
        on_error: ``"raise"`` a :class:`CorruptEventFileError` for a damaged
            event file, or ``"warn"`` (log once) and keep its readable records.

    Returns:
        Columns ``run`` (str), ``tag`` (str), ``step`` (int64), ``wall_time``
        (float64, seconds since the epoch), ``value`` (float64), sorted by run,
        tag and step; one row per (run, tag, step). Tags renamed since the logs were written
        are read under their current names (:data:`tbmem._internal.tags.RENAMED`).

    Raises:
        LogdirNotFoundError, NoEventFilesError, CorruptEventFileError: see their names.
        MissingExtraError: pandas is not installed (``pip install 'tbmem[analysis]'``).
    """
    return _read(logdir, runs=runs, progress=progress, on_error=on_error, texts=False)[0]


def load_texts(logdir: str | os.PathLike[str], *, runs: Iterable[str] | None = None,
               progress: bool | None = None, on_error: str = "raise") -> "pd.DataFrame":
    """Every text summary (``add_text``) under ``logdir``; same columns, ``value`` is the text.

    Tags are as passed to ``add_text`` (without the ``/text_summary`` suffix torch
    appends). The census writes its table of the largest tensors as the text tag
    ``Memory/Large_Tensors/top_k``.
    """
    return _read(logdir, runs=runs, progress=progress, on_error=on_error, scalars=False)[1]


def load_scalars_and_texts(logdir: str | os.PathLike[str], *, runs: Iterable[str] | None = None,
                           progress: bool | None = None, on_error: str = "raise"
                           ) -> "tuple[pd.DataFrame, pd.DataFrame]":
    """:func:`load_scalars` and :func:`load_texts` from one pass over the event files (half the
    reading of calling both; a damaged file is reported once)."""
    return _read(logdir, runs=runs, progress=progress, on_error=on_error)
