"""A tbmem logdir: its layout and file formats in one place, with a writer half and a reader half.

Below the writer and the readers alike, and torch-free (tests/test_architecture.py checks both):

* the layout as data, :mod:`tbmem._internal.logdir.layout`: folders, file names, the rank folders, and
  :data:`~tbmem._internal.logdir.layout.FORMATS`, each file format with its version, the module that writes
  it, the one that reads it and how older runs are read (event tags: :mod:`tbmem._internal.tags`);
* the writer half, used in the training process by :class:`tbmem.MemoryWriter`, the snapshot
  store and the ranks: :func:`~tbmem._internal.logdir.census_log.append_census`,
  :func:`~tbmem._internal.logdir.settings.append_settings`, the names of
  :mod:`~tbmem._internal.logdir.layout`;
* the reader half, used by the Memory tab (:mod:`tbmem._internal.plugin`), ``tbmem report`` and the
  analysis API (:mod:`tbmem.analysis`) and the notebook: :class:`~tbmem.analysis.LogdirReader`
  (censuses, snapshots, a run's settings), :mod:`~tbmem._internal.logdir.runs` (finding and grouping runs),
  :mod:`~tbmem._internal.logdir.events` (event files, old tag names), :mod:`~tbmem._internal.logdir.census_log`;
* :mod:`~tbmem._internal.logdir.safe_open`: every file of a logdir opened without following a symlink below it.

Example:
    >>> from tbmem._internal.logdir import FORMATS
    >>> [f.name for f in FORMATS]
    ['event tags', 'census side file', 'spikes side file', 'settings side file', 'profile trace', 'snapshot',
     'rank table']
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tbmem._internal._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "FORMATS": "tbmem._internal.logdir.layout",
    "Format": "tbmem._internal.logdir.layout",
    "PLUGIN_DIR": "tbmem._internal.logdir.layout",
    "CENSUS_LOG": "tbmem._internal.logdir.layout",
    "split_rank": "tbmem._internal.logdir.layout",
    "rank_dir": "tbmem._internal.logdir.layout",
    "snapshot_name": "tbmem._internal.logdir.layout",
    "census_log_path": "tbmem._internal.logdir.layout",
    "append_census": "tbmem._internal.logdir.census_log",
    "CensusLog": "tbmem._internal.logdir.census_log",
    "parse_census_markdown": "tbmem._internal.logdir.census_log",
    "find_runs": "tbmem._internal.logdir.runs",
    "group_runs": "tbmem._internal.logdir.runs",
    "find_snapshots": "tbmem._internal.logdir.snapshots",
    "SnapshotEntry": "tbmem._internal.logdir.snapshots",
    "LogdirReader": "tbmem._internal.logdir.reader",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # pragma: no cover
    from tbmem._internal.logdir.census_log import CensusLog, append_census, parse_census_markdown
    from tbmem._internal.logdir.layout import (CENSUS_LOG, FORMATS, PLUGIN_DIR, Format, census_log_path, rank_dir,
                                     snapshot_name, split_rank)
    from tbmem._internal.logdir.reader import LogdirReader
    from tbmem._internal.logdir.runs import find_runs, group_runs
    from tbmem._internal.logdir.snapshots import SnapshotEntry, find_snapshots


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
