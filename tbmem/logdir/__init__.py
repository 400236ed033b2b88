"""A tbmem logdir: its layout and file formats in one place, with a writer half and a reader half.

Below the writer and the readers alike, and torch-free (tests/test_architecture.py checks both):

* the layout as data, :mod:`tbmem.logdir.layout`: folders, file names, the rank folders, and
  :data:`~tbmem.logdir.layout.FORMATS`, each file format with its version, the module that writes
  it, the one that reads it and how older runs are read (event tags: :mod:`tbmem.tags`);
* the writer half, used in the training process by :class:`tbmem.MemoryWriter`, the snapshot
  store and the ranks: :func:`~tbmem.logdir.census_log.append_census`,
  :func:`~tbmem.logdir.settings.append_settings`, the names of
  :mod:`~tbmem.logdir.layout`;
* the reader half, used by the Memory tab (:mod:`tbmem.plugin`), ``tbmem report`` and the
  analysis API (:mod:`tbmem.analysis`) and the notebook: :class:`~tbmem.logdir.reader.LogdirReader`
  (censuses, snapshots, a run's settings), :mod:`~tbmem.logdir.runs` (finding and grouping runs),
  :mod:`~tbmem.logdir.events` (event files, old tag names), :mod:`~tbmem.logdir.census_log`;
* :mod:`~tbmem.logdir.safe_open`: every file of a logdir opened without following a symlink below it.

Example:
    >>> from tbmem.logdir import FORMATS
    >>> [f.name for f in FORMATS]
    ['event tags', 'census side file', 'spikes side file', 'settings side file', 'profile trace', 'snapshot',
     'rank table']
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tbmem._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "FORMATS": "tbmem.logdir.layout",
    "Format": "tbmem.logdir.layout",
    "PLUGIN_DIR": "tbmem.logdir.layout",
    "CENSUS_LOG": "tbmem.logdir.layout",
    "split_rank": "tbmem.logdir.layout",
    "rank_dir": "tbmem.logdir.layout",
    "snapshot_name": "tbmem.logdir.layout",
    "census_log_path": "tbmem.logdir.layout",
    "append_census": "tbmem.logdir.census_log",
    "CensusLog": "tbmem.logdir.census_log",
    "parse_census_markdown": "tbmem.logdir.census_log",
    "find_runs": "tbmem.logdir.runs",
    "group_runs": "tbmem.logdir.runs",
    "find_snapshots": "tbmem.logdir.snapshots",
    "SnapshotEntry": "tbmem.logdir.snapshots",
    "LogdirReader": "tbmem.logdir.reader",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # pragma: no cover
    from tbmem.logdir.census_log import CensusLog, append_census, parse_census_markdown
    from tbmem.logdir.layout import (CENSUS_LOG, FORMATS, PLUGIN_DIR, Format, census_log_path, rank_dir,
                                     snapshot_name, split_rank)
    from tbmem.logdir.reader import LogdirReader
    from tbmem.logdir.runs import find_runs, group_runs
    from tbmem.logdir.snapshots import SnapshotEntry, find_snapshots


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
