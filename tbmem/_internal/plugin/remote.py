"""The Memory tab on a remote logdir (``tensorboard --logdir s3://bucket/runs``): side files in a local cache.

TensorBoard reads a remote logdir's event files itself (its own S3 client: ``S3_ENDPOINT`` and
the AWS variables). tbmem's side files of a run (``plugins/tbmem/``: the census, snapshots and
their pages), and for a rank's run its job's rank tables (``<job>/ranks/``, the compact layout), are
copied through fsspec (:func:`tbmem._internal.logdir.fs.fetch`, files whose size changed only) into a
temporary folder of the server's, at most every ``refresh_s`` seconds per run, and
read from there with the same checks as a local logdir's (inside the cache, no symlink followed).

Example:
    >>> from tbmem._internal.plugin.remote import RemoteRuns
    >>> RemoteRuns("s3://bucket/runs").run_dir("../etc") is None
    True
"""

from __future__ import annotations

import os
import tempfile
import threading
import time

from tbmem._internal._log import report_once
from tbmem._internal.logdir.fs import fetch, join_url
from tbmem._internal.logdir.layout import PLUGIN_DIR, split_rank
from tbmem._internal.logdir.rank_table import RANK_TABLE_DIR

__all__ = ["RemoteRuns"]


class RemoteRuns:
    """Maps run names of a remote logdir to local copies of their side files.

    Args:
        url: The logdir TensorBoard was given. refresh_s: The longest a copy is reused.
    """

    def __init__(self, url: str, *, refresh_s: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.refresh_s = refresh_s
        self.root = ""  # created at the first run asked for
        self._fetched: dict[str, float] = {}
        self._lock = threading.Lock()

    def run_dir(self, run: str) -> tuple[str, str] | None:
        """(the run's local copy, the cache root), fetched when older than ``refresh_s``; None for a
        name that could leave the logdir or when the store cannot be read."""
        parts = run.split("/")
        if run != "." and (any(p in ("", "..", ".") for p in parts) or "\\" in run or os.path.isabs(run)):
            return None
        with self._lock:
            if not self.root:
                self.root = os.path.realpath(tempfile.mkdtemp(prefix="tbmem-tab-remote-"))
            local = self.root if run == "." else os.path.join(self.root, *parts)
            if time.monotonic() - self._fetched.get(run, -1e9) >= self.refresh_s:
                remote = join_url(self.url, *([] if run == "." else parts), PLUGIN_DIR.replace(os.sep, "/"))
                os.makedirs(local, exist_ok=True)
                copies = [(remote, os.path.join(local, PLUGIN_DIR))]
                if run != "." and split_rank(parts[-1])[1] is not None:  # a rank's run: its job's rank tables
                    copies.append((join_url(self.url, *parts[:-1], RANK_TABLE_DIR),
                                   os.path.join(os.path.dirname(local), RANK_TABLE_DIR)))
                for url, target in copies:
                    try:
                        fetch(url, target)
                    except FileNotFoundError:
                        pass  # a run without side files, a job without rank tables
                    except Exception as exc:  # noqa: BLE001 - the tab shows the events without them
                        report_once(f"tab-remote:{self.url}", f"tbmem: cannot read the side files of {url}", exc=exc)
                self._fetched[run] = time.monotonic()
        return local, self.root
