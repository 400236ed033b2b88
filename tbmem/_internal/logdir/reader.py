"""One reader of a logdir's side files, shared by the Memory tab, the notebook and the command line.

A :class:`LogdirReader` maps a run name to its folder (below the logdir, by
:func:`tbmem.analysis.find_runs`; the Memory tab passes TensorBoard's own mapping) and
reads what tbmem wrote beside the event files: the census side file
(:class:`tbmem._internal.logdir.census_log.CensusLog`, incrementally, one instance for every run) and
the snapshots (:func:`tbmem._internal.logdir.snapshots.find_snapshots`). Every folder is resolved with
``realpath`` and must lie inside the root it was found under; files are opened without
following a symlink below it (:mod:`tbmem._internal.logdir.safe_open`). The event files are read by
:mod:`tbmem._internal.logdir.events` (``tbmem report``, the analysis API), or by TensorBoard for the tab.

Example:
    >>> import tempfile
    >>> from tbmem import MemoryWriter
    >>> from tbmem._internal.logdir import LogdirReader
    >>> logdir = tempfile.mkdtemp()
    >>> with MemoryWriter(f"{logdir}/exp/run_a", every=1, census_every=1, snapshot={"steps": [0]}) as w:
    ...     _ = w.log_memory(0)
    >>> reader = LogdirReader(logdir)
    >>> reader.runs(), sorted(reader.census("exp/run_a")), [s.name for s in reader.snapshots("exp/run_a")]
    (['exp/run_a'], [0], ['plugins/tbmem/snapshot_rank0_step000000000.json.gz'])
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable

from tbmem._internal.logdir.census_log import CensusLog
from tbmem._internal.logdir.layout import census_log_path
from tbmem._internal.logdir.runs import find_runs
from tbmem._internal.logdir.safe_open import resolve_inside
from tbmem._internal.logdir.settings import RunSettings, read_settings
from tbmem._internal.logdir.snapshots import SnapshotEntry, find_snapshots
from tbmem._internal.tags import loss_tags

__all__ = ["LogdirReader", "RunDirFinder"]

#: ``run name -> (the run's folder, the root it must stay in)``, both realpaths; None for no such run.
RunDirFinder = Callable[[str], "tuple[str, str] | None"]


class LogdirReader:
    """The side files of a logdir's runs: censuses, snapshots, the run's settings. Thread-safe; one instance serves every run.

    Args:
        logdir: The logdir: its runs are the folders :func:`tbmem.analysis.find_runs` names.
        run_dir: Maps a run name to ``(folder, root)`` instead (the Memory tab gives TensorBoard's
            runs); then ``logdir`` may be None.
    """

    def __init__(self, logdir: str | os.PathLike[str] | None = None, *, run_dir: RunDirFinder | None = None) -> None:
        if logdir is None and run_dir is None:
            raise ValueError("LogdirReader needs a logdir or a run_dir mapping")
        self._logdir = os.fspath(logdir) if logdir is not None else None
        self._find = run_dir if run_dir is not None else self._below_logdir
        self._census = CensusLog()
        self._lock = threading.Lock()
        self._dirs: dict[str, str] = {}

    def runs(self) -> list[str]:
        """The run names under the logdir, sorted (empty for a reader given only a ``run_dir`` mapping)."""
        return sorted(self._runs()) if self._logdir is not None else []

    def run_dir(self, run: str) -> tuple[str, str] | None:
        """(the run's folder, the root it must stay in), realpaths; None for an unknown run or one outside."""
        return self._find(run)

    def census(self, run: str) -> dict[int, dict[str, Any]]:
        """Step -> the census record of every census the run's side file holds ({} without one).

        Old runs have none: their censuses are the markdown tables of the text tag
        ``Memory/Large_Tensors/top_k`` (:func:`tbmem._internal.logdir.census_log.parse_census_markdown`).
        """
        found = self.run_dir(run)
        return self._census.read(census_log_path(found[0]), root=found[1]) if found else {}

    def settings(self, run: str) -> RunSettings:
        """What the run's writers recorded for its readers (its loss tags, its module depth:
        :mod:`tbmem._internal.logdir.settings`); the defaults for a run without them."""
        found = self.run_dir(run)
        return read_settings(found[0], root=found[1]) if found else RunSettings()

    def loss_tags(self, run: str) -> tuple[str, ...]:
        """The patterns of the run's loss tags: the built-in ones, the run's own, this process's
        ``TBMEM_LOSS_TAGS`` (:func:`tbmem._internal.tags.loss_tags`)."""
        return loss_tags(self.settings(run).loss_tags)

    def snapshots(self, run: str) -> list[SnapshotEntry]:
        """The run's snapshots, sorted by step then name."""
        found = self.run_dir(run)
        return find_snapshots(*found) if found else []

    def _runs(self) -> dict[str, str]:
        assert self._logdir is not None
        dirs = {run: os.path.dirname(os.fspath(files[0])) for run, files in find_runs(self._logdir).items()}
        with self._lock:
            self._dirs = dirs
        return dirs

    def _below_logdir(self, run: str) -> tuple[str, str] | None:
        with self._lock:
            path = self._dirs.get(run)
        if path is None:
            path = self._runs().get(run)  # a run that appeared since
        if path is None:
            return None
        root = os.path.realpath(self._logdir or "")
        found = resolve_inside(path, [root])
        return found if found is not None and os.path.isdir(found[0]) else None
