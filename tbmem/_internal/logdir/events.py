"""The event files of a logdir's runs, read record by record with TensorBoard's own loader.

Records are read with TensorBoard's ``RawEventFileLoader`` and parsed as its ``Event`` protos.
TensorBoard silently stops at a truncated or corrupt record (a file still being written looks
the same); :func:`records` checks that the records it got account for every byte of the file,
so a damaged file is reported instead of silently cut short.

The event tags have versions (:data:`tbmem._internal.logdir.layout.FORMATS`): tbmem 0.1's names are read
under their current names (:func:`current_name`, from :data:`tbmem._internal.tags.RENAMED`).
``tbmem report``, the analysis API (:mod:`tbmem._internal.analysis.load`, which makes DataFrames of
:func:`read_columns`) and the notebook read events here; the Memory tab reads them through
TensorBoard's data provider.

Example:
    >>> import tempfile
    >>> from tbmem import MemoryWriter
    >>> from tbmem._internal.logdir.events import event_files, read_columns
    >>> logdir = tempfile.mkdtemp()
    >>> with MemoryWriter(f"{logdir}/run_a", every=1, custom_layout=False) as w:
    ...     w.write_scalars({"Memory/RAM/process_rss_GB": 1.5}, step=3)
    >>> numbers, _ = read_columns(event_files(logdir), texts=False)
    >>> numbers["run"], numbers["tag"], numbers["step"], numbers["value"]
    (['run_a'], ['Memory/RAM/process_rss_GB'], [3], [1.5])
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from tbmem._internal._fastcrc import install_reader as install_fast_crc_reader
from tbmem._internal._log import logger
from tbmem._internal.logdir.errors import AnalysisError, CorruptEventFileError, NoEventFilesError
from tbmem._internal.logdir.layout import TEXT_SUFFIX
from tbmem._internal.logdir.runs import find_runs
from tbmem._internal.tags import current_tag

__all__ = ["EventFile", "event_files", "records", "scalar_value", "read_columns", "COLUMNS", "current_name",
           "GPU_TAG_PREFIXES", "OLD_EPOCH_TAG", "CPU_EPOCH_TAG"]

_RECORD_OVERHEAD = 16  # TFRecord framing: u64 length, u32 length crc, data, u32 data crc
#: The columns of :func:`read_columns`: one entry per value.
COLUMNS = ("run", "tag", "step", "wall_time", "value")
#: A run with a tag starting so has VRAM readings (in either version of the tags).
GPU_TAG_PREFIXES = ("Memory/vram_", "Memory/GPU/")
#: tbmem 0.1's per-epoch peak: the VRAM peak on GPU runs, the peak RSS on CPU runs ...
OLD_EPOCH_TAG = "Memory/Epoch/gpu_peak_MB"
#: ... which is read under this name on a run without VRAM tags.
CPU_EPOCH_TAG = "Monitor/epoch_cpu_peak_rss_MB"


def current_name(tag: str, *, gpu_run: bool = True) -> str:
    """The name a tag has in the current version of the event tags (``gpu_run``: the run has VRAM tags).

    Example:
        >>> current_name("Memory/vram_allocated_GB"), current_name(OLD_EPOCH_TAG, gpu_run=False)
        ('Memory/GPU/vram_allocated_GB', 'Monitor/epoch_cpu_peak_rss_MB')
    """
    if tag == OLD_EPOCH_TAG and not gpu_run:
        return CPU_EPOCH_TAG
    return current_tag(tag)


@dataclass(frozen=True)
class EventFile:
    """One event file of a run, with its size when listed (what :func:`records` must account for)."""

    run: str
    path: Path
    size: int


def event_files(logdir: str | os.PathLike[str], runs: Iterable[str] | None = None) -> list[EventFile]:
    """The event files of every run under ``logdir`` (of ``runs`` only, when given).

    Raises:
        LogdirNotFoundError, NoEventFilesError: see their names; AnalysisError: no run of that name.
    """
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
    return [EventFile(run, p, p.stat().st_size) for run, files in found.items() for p in files]


def records(ef: EventFile, on_error: str = "raise") -> Iterable[Any]:
    """Yield the Event protos of one file; check that they cover the whole file (``on_error``: ``"raise"``
    a :class:`CorruptEventFileError` for a damaged file, or ``"warn"``: log it and keep what is readable)."""
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


def _damaged(ef: EventFile, why: str, on_error: str) -> None:
    message = f"event file {str(ef.path)!r} (run {ef.run!r}) is damaged: {why}"
    if on_error == "raise":
        raise CorruptEventFileError(message + "; pass on_error='warn' (CLI: --allow-truncated) "
                                              "to analyse the readable part")
    logger.warning("tbmem: %s; using the readable part", message)


def scalar_value(value: Any) -> float | None:
    """The number of a ``Summary.Value`` (a ``simple_value`` or a scalar tensor); None when it holds none."""
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


def read_columns(files: Iterable[EventFile], *, on_error: str = "raise", scalars: bool = True,
                 texts: bool = True) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
    """The scalars and the texts of ``files``, from one pass, as columns (:data:`COLUMNS`, a list each).

    Tags are as written, texts without the ``/text_summary`` suffix torch's ``add_text`` appends.
    """
    if on_error not in ("raise", "warn"):
        raise ValueError(f"on_error must be 'raise' or 'warn', got {on_error!r}")
    install_fast_crc_reader()  # TensorBoard checks every record's CRC in pure Python otherwise
    numbers: dict[str, list[Any]] = {c: [] for c in COLUMNS}
    words: dict[str, list[Any]] = {c: [] for c in COLUMNS}
    for ef in files:
        for event in records(ef, on_error):
            if not event.HasField("summary"):
                continue
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == "text":
                    if not (texts and value.tensor.string_val):
                        continue
                    cols, tag = words, value.tag.removesuffix(TEXT_SUFFIX)
                    v: Any = value.tensor.string_val[0].decode("utf-8", errors="replace")
                else:
                    v = scalar_value(value) if scalars else None
                    if v is None:
                        continue
                    cols, tag = numbers, value.tag
                cols["run"].append(ef.run)
                cols["tag"].append(tag)
                cols["step"].append(event.step)
                cols["wall_time"].append(event.wall_time)
                cols["value"].append(v)
    return numbers, words
