"""Read a TensorBoard logdir into a pandas DataFrame with TensorBoard's own event loading.

A *run* is what TensorBoard calls a run: a directory that directly holds event
files (TensorBoard's ``io_wrapper.IsSummaryEventsFile``), named by its path
relative to the logdir; the logdir itself, when it holds event files, is named by its
folder (``2026-11-26_00-35-02`` for ``tbmem report runs/exp/2026-11-26_00-35-02``), or ``"."``
where that name is taken by another run or the folder has none. Symbolic links are
followed, but each real directory is visited once, under its path with the
fewest links (then the shortest), so a link loop (``loop -> .``) neither hangs
the walk nor repeats a run.
Records are read with TensorBoard's ``RawEventFileLoader`` and parsed as its
``Event`` protos.

TensorBoard silently stops at a truncated or corrupt record (a file still being
written looks the same). tbmem checks that the records it got account for every
byte of the file, so a damaged file is reported instead of silently cut short.

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

import heapq
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from tbmem._extras import require
from tbmem._fastcrc import install_reader as install_fast_crc_reader
from tbmem._log import logger

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

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
    "PROGRESS_MIN_FILES",
]

#: Show a progress bar (tqdm, on stderr) from this many event files on, when ``progress=None``.
PROGRESS_MIN_FILES = 20
_RECORD_OVERHEAD = 16  # TFRecord framing: u64 length, u32 length crc, data, u32 data crc
_COLUMNS = ["run", "tag", "step", "wall_time", "value"]
_TEXT_SUFFIX = "/text_summary"  # torch's add_text appends it to the tag it is given


class AnalysisError(Exception):
    """A logdir cannot be analysed; the message says why in words a user can act on."""


class LogdirNotFoundError(AnalysisError):
    """The logdir does not exist or is not a directory."""


class NoEventFilesError(AnalysisError):
    """The logdir holds no TensorBoard event files."""


class NoTbmemTagsError(AnalysisError):
    """The event files hold none of the tags tbmem writes."""


class CorruptEventFileError(AnalysisError):
    """An event file ends in a truncated record or fails a checksum."""


@dataclass(frozen=True)
class _EventFile:
    run: str
    path: Path
    size: int


def find_runs(logdir: str | os.PathLike[str]) -> dict[str, list[Path]]:
    """Map run name -> its event files (sorted), for every run under ``logdir``.

    Raises:
        LogdirNotFoundError: ``logdir`` is missing or not a directory.
    """
    from tensorboard.backend.event_processing import io_wrapper

    root = Path(logdir)
    if not root.is_dir():
        raise LogdirNotFoundError(f"logdir {str(root)!r} does not exist or is not a directory")
    runs: dict[str, list[Path]] = {}
    for sub, names in _walk_once(str(root)):
        files = sorted(Path(sub) / name for name in names
                       if io_wrapper.IsSummaryEventsFile(os.path.join(sub, name)))
        if files:
            rel = os.path.relpath(sub, root)
            runs[Path(rel).as_posix()] = files
    own = Path(os.path.abspath(root)).name
    if "." in runs and own and own not in runs:  # a logdir that is itself a run: named by its folder
        runs[own] = runs.pop(".")
    return dict(sorted(runs.items()))


def _walk_once(root: str) -> Iterable[tuple[str, list[str]]]:
    """``(directory, file names)`` for every directory under ``root``, each real directory once.

    Directories are taken in order of (links on the path, depth, path), so a directory reached
    both directly and through a link is named by its direct path, and a loop ends at once.
    """
    seen: set[tuple[int, int]] = set()
    queue: list[tuple[int, int, str]] = [(0, 0, root)]
    while queue:
        links, depth, path = heapq.heappop(queue)
        try:
            st = os.stat(path)
        except OSError:
            continue  # a dangling link, or removed while walking
        if (st.st_dev, st.st_ino) in seen:
            continue
        seen.add((st.st_dev, st.st_ino))
        try:
            entries = list(os.scandir(path))
        except OSError as exc:
            logger.warning("tbmem: skipping %s (%s)", path, exc.strerror or exc)
            continue
        files = []
        for entry in entries:
            try:
                is_dir = entry.is_dir(follow_symlinks=True)
            except OSError:
                continue
            if is_dir:
                heapq.heappush(queue, (links + entry.is_symlink(), depth + 1, entry.path))
            else:
                files.append(entry.name)
        yield path, files


def _event_files(logdir: str | os.PathLike[str], runs: Iterable[str] | None) -> list[_EventFile]:
    found = find_runs(logdir)
    if not found:
        raise NoEventFilesError(f"no TensorBoard event files (events.out.tfevents.*) under {str(logdir)!r}")
    if runs is not None:
        wanted = list(runs)
        missing = [r for r in wanted if r not in found]
        if missing:
            raise AnalysisError(f"no run named {missing[0]!r} under {str(logdir)!r}; "
                                f"runs: {', '.join(sorted(found))}")
        found = {r: found[r] for r in wanted}
    return [_EventFile(run, p, p.stat().st_size) for run, files in found.items() for p in files]


def _records(ef: _EventFile, on_error: str) -> Iterable[Any]:
    """Yield the Event protos of one file; check that they cover the whole file."""
    from google.protobuf.message import DecodeError
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto import event_pb2

    consumed = 0
    for raw in RawEventFileLoader(str(ef.path)).Load():
        consumed += len(raw) + _RECORD_OVERHEAD
        try:
            yield event_pb2.Event.FromString(raw)
        except DecodeError as exc:  # a record with a valid checksum but not an Event
            _damaged(ef, f"a record does not parse as an Event ({exc})", on_error)
            return
    if consumed < ef.size:
        _damaged(ef, f"only {consumed} of its {ef.size} bytes are complete records "
                     f"(truncated, corrupt, or still being written)", on_error)


def _damaged(ef: _EventFile, why: str, on_error: str) -> None:
    message = f"event file {str(ef.path)!r} (run {ef.run!r}) is damaged: {why}"
    if on_error == "raise":
        raise CorruptEventFileError(message + "; pass on_error='warn' (CLI: --allow-truncated) "
                                              "to analyse the readable part")
    logger.warning("tbmem: %s; using the readable part", message)


def _scalar(value: Any) -> float | None:
    kind = value.WhichOneof("value")
    if kind == "simple_value":
        return float(value.simple_value)
    if kind == "tensor" and value.metadata.plugin_data.plugin_name in ("scalars", ""):
        t = value.tensor
        if t.tensor_shape.dim and any(d.size != 1 for d in t.tensor_shape.dim):
            return None  # not a scalar
        if t.float_val:
            return float(t.float_val[0])
        if t.double_val:
            return float(t.double_val[0])
        if t.tensor_content and t.dtype in (1, 2):  # DT_FLOAT, DT_DOUBLE packed as bytes
            from tensorboard.util import tensor_util

            arr = tensor_util.make_ndarray(t)
            return float(arr.reshape(-1)[0]) if arr.size == 1 else None
    return None


def _iter_files(files: list[_EventFile], progress: bool | None) -> Iterable[_EventFile]:
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
    install_fast_crc_reader()  # TensorBoard checks every record's CRC in pure Python otherwise
    numbers: dict[str, list[Any]] = {c: [] for c in _COLUMNS}
    words: dict[str, list[Any]] = {c: [] for c in _COLUMNS}
    for ef in _iter_files(_event_files(logdir, runs), progress):
        for event in _records(ef, on_error):
            if not event.HasField("summary"):
                continue
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == "text":
                    if not (texts and value.tensor.string_val):
                        continue
                    cols, tag = words, value.tag.removesuffix(_TEXT_SUFFIX)
                    v: Any = value.tensor.string_val[0].decode("utf-8", errors="replace")
                else:
                    v = _scalar(value) if scalars else None
                    if v is None:
                        continue
                    cols, tag = numbers, value.tag
                cols["run"].append(ef.run)
                cols["tag"].append(tag)
                cols["step"].append(event.step)
                cols["wall_time"].append(event.wall_time)
                cols["value"].append(v)
    return _frame(pd, numbers, "float64"), _frame(pd, words, object)


def _frame(pd: Any, cols: dict[str, list[Any]], value_type: Any) -> "pd.DataFrame":
    df = pd.DataFrame(cols).astype({"run": str, "tag": str, "step": "int64", "wall_time": "float64",
                                    "value": value_type})
    if value_type != object:
        df = _current_names(df)
    # A run restarted in the same directory rewrites steps: keep the latest write of each
    # (run, tag, step), as TensorBoard's purge of orphaned data does.
    df = df.sort_values("wall_time", kind="stable").drop_duplicates(["run", "tag", "step"], keep="last")
    return df.sort_values(["run", "tag", "step"], kind="stable").reset_index(drop=True)


def _current_names(df: "pd.DataFrame") -> "pd.DataFrame":
    """Logs written before tbmem 0.2 renamed its tags read under the current names (CHANGELOG.md)."""
    from tbmem.tags import RENAMED, current_tag

    names = {t: current_tag(t) for t in df["tag"].unique()}
    if all(k == v for k, v in names.items()):
        return df
    old_epoch = "Memory/Epoch/gpu_peak_MB"  # held the peak RSS on CPU runs: a run without VRAM tags
    gpu_runs = set(df.loc[df["tag"].str.startswith(("Memory/vram_", "Memory/GPU/")), "run"])
    df = df.assign(tag=df["tag"].map(names))
    cpu_epoch = (df["tag"] == RENAMED[old_epoch]) & ~df["run"].isin(gpu_runs)
    df.loc[cpu_epoch, "tag"] = "Monitor/epoch_cpu_peak_rss_MB"
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
        are read under their current names (:data:`tbmem.tags.RENAMED`).

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
