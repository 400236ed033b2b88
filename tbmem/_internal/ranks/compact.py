"""The compact layout of a large job: one TensorBoard run for the job, runs for the ranks that matter.

Under ``RanksConfig(layout="compact")`` (the default above ``compact_above`` ranks):

- rank 0 writes ``<job>/rank0`` as in the per-rank layout: its records, the cross-rank aggregates
  (``Ranks/<tag>/max|min|mean|argmax``) and the ``tbmem: ranks`` charts (the min..max band).
- every other rank writes its TensorBoard run into a private folder outside the logdir (its
  ``staging`` folder, in the temporary directory: :func:`staging_folder`): nothing for TensorBoard
  to list or poll, and nobody reads it before close, so its events reach the file in batches
  (:meth:`tbmem._internal._safe_io.SafeRecordWriter.hold`) and the records are not flushed one by one. At
  ``close`` the run is moved to ``<job>/rank<r>`` when the rank matters (it held the peak of VRAM
  or RSS in some record, rank 0 says so through the job's store; or it ran out of memory, wrote a
  snapshot after a peer's out-of-memory error, or fired an alert), else deleted.
- every rank's records go to its node's rank table, ``<job>/ranks/node<n>.parquet``
  (:mod:`tbmem._internal.logdir.rank_table`), through :class:`tbmem._internal.ranks.channel.NodeChannel`: each
  node's local rank 0 receives its peers' records on a Unix datagram socket and appends them.

Example:
    >>> from tbmem._internal.ranks.compact import PeakRanks
    >>> peaks = PeakRanks()
    >>> peaks.see({"Ranks/Memory/RAM/process_rss_GB/max": 2.0, "Ranks/Memory/RAM/process_rss_GB/argmax": 3.0})
    >>> peaks.see({"Ranks/Memory/RAM/process_rss_GB/max": 1.0, "Ranks/Memory/RAM/process_rss_GB/argmax": 5.0})
    >>> peaks.ranks()
    [3]
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Mapping

from tbmem._internal._log import logger
from tbmem._internal.ranks.channel import NodeChannel, node_name
from tbmem._internal.tags import TAGS, ranks_tag

__all__ = ["PeakRanks", "NodeChannel", "node_name", "move_run", "staging_folder", "PEAK_READINGS"]

#: The readings whose peak rank keeps its TensorBoard run: VRAM (peak allocated, else allocated) and RSS.
PEAK_READINGS = (("vram_peak_allocated", "vram_allocated"), ("ram_rss",), ("ram_tree_rss",))


class PeakRanks:
    """The ranks holding the peak of VRAM and RSS over a job's records, from rank 0's aggregates."""

    def __init__(self) -> None:
        self._best: dict[str, tuple[float, int]] = {}

    def see(self, values: Mapping[str, float]) -> None:
        """One record's aggregates (what rank 0 writes)."""
        for keys in PEAK_READINGS:
            for key in keys:
                tag = TAGS[key].tag
                high, arg = values.get(ranks_tag("max", tag)), values.get(ranks_tag("argmax", tag))
                if high is None or arg is None:
                    continue
                best = self._best.get(keys[0])
                if best is None or high > best[0]:
                    self._best[keys[0]] = (float(high), int(arg))
                break

    def ranks(self) -> list[int]:
        """The peak ranks, sorted, each once."""
        return sorted({rank for _, rank in self._best.values()})


_STAGING_PREFIX = "tbmem-rank"


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid").split("[")[-1].rstrip("]")
    except OSError:
        return "0"


def staging_folder(rank: int) -> str:
    """A new private folder for rank ``rank``'s run, in the temporary directory.

    Its name holds the process (``tbmem-rank<r>-<pid namespace>-<pid>-*``), so that the folders of
    ranks killed before ``close()`` are removed by the next job's ranks on the node: those of this
    user, in this pid namespace (another container's pids say nothing here), whose process is gone.
    """
    base = tempfile.gettempdir()
    namespace = _pid_namespace()
    try:
        for entry in os.scandir(base):
            parts = entry.name.split("-")
            if (not entry.name.startswith(_STAGING_PREFIX) or len(parts) < 5 or parts[2] != namespace
                    or not parts[3].isdigit() or not entry.is_dir(follow_symlinks=False)
                    or entry.stat(follow_symlinks=False).st_uid != os.getuid()):
                continue
            try:
                os.kill(int(parts[3]), 0)
            except ProcessLookupError:
                shutil.rmtree(entry.path, ignore_errors=True)
                logger.info("tbmem: removed %s, the private run of a rank that ended before close()", entry.path)
            except OSError:
                pass  # alive (another user's pid: EPERM)
    except OSError:
        pass  # a temporary directory that cannot be listed: nothing swept
    return tempfile.mkdtemp(prefix=f"{_STAGING_PREFIX}{rank}-{namespace}-{os.getpid()}-")


def move_run(staging: str, final: str) -> None:
    """Move a rank's staged run into the job (across file systems too, or to a URL), replacing nothing.
    The staged folder is removed only once everything is there."""
    from tbmem._internal.logdir.fs import is_url, upload_folder

    if is_url(final):
        upload_folder(staging, final)
        shutil.rmtree(staging, ignore_errors=True)
        return
    os.makedirs(os.path.dirname(final) or ".", exist_ok=True)
    if os.path.exists(final):
        for name in os.listdir(staging):
            shutil.move(os.path.join(staging, name), os.path.join(final, name))
        shutil.rmtree(staging, ignore_errors=True)
    else:
        shutil.move(staging, final)
