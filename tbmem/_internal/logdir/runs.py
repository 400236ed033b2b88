"""The runs of a logdir: every folder that directly holds event files, named by its path below the logdir.

A *run* is what TensorBoard calls a run: a directory that directly holds event files
(TensorBoard's ``io_wrapper.IsSummaryEventsFile``), named by its path relative to the logdir;
the logdir itself, when it holds event files, is named by its folder
(``2026-11-26_00-35-02`` for ``tbmem report runs/exp/2026-11-26_00-35-02``), or ``"."`` where
that name is taken by another run or the folder has none. Symbolic links are followed, but
each real directory is visited once, under its path with the fewest links (then the
shortest), so a link loop (``loop -> .``) neither hangs the walk nor repeats a run.
A multi-rank job's runs (``exp/rank0``, ``exp/rank1``, ...) form one group
(:func:`group_runs`, by :func:`tbmem._internal.logdir.layout.split_rank`).

``tbmem report``, the analysis API and the notebook find runs here; the Memory tab is given
TensorBoard's list of runs and groups it here.

Example:
    >>> from tbmem._internal.logdir.runs import group_runs
    >>> [(g["group"], [m["rank"] for m in g["members"]]) for g in group_runs(["exp/rank1", "exp/rank0", "b"])]
    [('b', [None]), ('exp', [0, 1])]
"""

from __future__ import annotations

import heapq
import os
from pathlib import Path
from typing import Any, Iterable

from tbmem._internal._log import logger
from tbmem._internal.logdir.errors import LogdirNotFoundError
from tbmem._internal.logdir.layout import split_rank

__all__ = ["find_runs", "walk_once", "group_runs"]


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
    for sub, names in walk_once(str(root)):
        files = sorted(Path(sub) / name for name in names
                       if io_wrapper.IsSummaryEventsFile(os.path.join(sub, name)))
        if files:
            rel = os.path.relpath(sub, root)
            runs[Path(rel).as_posix()] = files
    own = Path(os.path.abspath(root)).name
    if "." in runs and own and own not in runs:  # a logdir that is itself a run: named by its folder
        runs[own] = runs.pop(".")
    return dict(sorted(runs.items()))


def walk_once(root: str) -> Iterable[tuple[str, list[str]]]:
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


def group_runs(runs: Iterable[str]) -> list[dict[str, Any]]:
    """Runs grouped by experiment, ranks together: groups sorted by name, members by rank (the
    rankless run first). A run named like the group (rank 0's cross-rank aggregates) joins it with rank None."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        group, rank = split_rank(run)
        groups.setdefault(group, []).append({"run": run, "rank": rank})
    return [{"group": g, "members": sorted(m, key=lambda r: (r["rank"] is not None, r["rank"] or 0))}
            for g, m in sorted(groups.items())]
