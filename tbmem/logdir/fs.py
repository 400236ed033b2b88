"""Remote logdirs (``s3://``, ``gs://``, any fsspec URL): one file-system layer for what tbmem writes and reads.

tbmem writes a run as local files (event files appended record by record, ``census.jsonl``
appended line by line, snapshots renamed into place): object stores have no append and no
rename. So a writer given a URL writes its run into a local mirror folder, exactly as for a
local logdir, and :class:`RemoteMirror` copies every new or changed file of it to the URL
through fsspec, on a thread of its own, every ``every_s`` seconds and at close. Readers
(``tbmem report``, the analysis API) copy a remote logdir into a local folder first
(:func:`fetch`) and read that.

A store that stops answering never stops training: the upload fails on the mirror's thread,
one message says so and where the files are kept (the mirror folder), and later rounds retry
quietly; what was uploaded before stays readable there.

The store's address and credentials are fsspec's and its backend's: for S3, ``AWS_ENDPOINT_URL``
(a local or S3-compatible server), ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` or a profile.
TensorBoard reads the event files of ``s3://`` itself (``S3_ENDPOINT`` for its own S3 client).

Example:
    >>> from tbmem.logdir.fs import is_url
    >>> is_url("s3://bucket/run"), is_url("gs://b/r"), is_url("runs/exp"), is_url("/tmp/x")
    (True, True, False, False)
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
import time
from typing import Any

from tbmem._extras import require
from tbmem._log import logger, report_once

__all__ = ["is_url", "RemoteMirror", "fetch", "join_url", "upload_file", "upload_folder"]

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_SKIP = re.compile(r"^(\.tmp-|\.tbmem-write-test-)")  # files being written: uploaded once renamed
# An object store cannot append: a grown event file is uploaded whole again. A file uploaded before
# waits size / this many seconds (at least every_s) before it is uploaded again, so that a long
# run's growing files cost at most about this many bytes a second each; close() uploads everything.
REUPLOAD_BYTES_PER_S = 1 << 20


def is_url(path: Any) -> bool:
    """Whether ``path`` is a URL (``s3://...``), not a local path (``file://`` counts as a URL)."""
    return isinstance(path, str) and bool(_URL.match(path))


def join_url(url: str, *parts: str) -> str:
    """``url`` with ``parts`` appended, ``/``-separated."""
    return "/".join([url.rstrip("/"), *(p.strip("/") for p in parts if p)])


def _fs(url: str) -> tuple[Any, str]:
    fsspec = require("fsspec", extra="remote")
    return fsspec.core.url_to_fs(url)


class RemoteMirror:
    """Copies a local run folder to a URL, file by file, when files are new or changed.

    Args:
        url: Where the run goes (``s3://bucket/runs/exp``).
        local: The local folder the run is written to.
        every_s: Seconds between upload rounds (0: at :meth:`close` only).
    """

    def __init__(self, url: str, local: str, *, every_s: float = 10.0) -> None:
        self.url, self.local, self.every_s = url.rstrip("/"), local, every_s
        self.fs, self._root = _fs(self.url)
        self._sent: dict[str, tuple[int, int]] = {}  # relative path -> (size, mtime_ns) uploaded
        self._sent_at: dict[str, float] = {}  # relative path -> when it was last uploaded (monotonic)
        self._failing = False
        self.uploads = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if every_s > 0:
            self._thread = threading.Thread(target=self._loop, name="tbmem-remote", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sync()

    def sync(self, *, final: bool = False) -> bool:
        """One upload round; True when every changed file was uploaded. A file uploaded before and
        changed since waits its turn (:data:`REUPLOAD_BYTES_PER_S`) unless ``final``."""
        with self._lock:
            try:
                now = time.monotonic()
                for rel, stamp in self._changed():
                    last = self._sent_at.get(rel)
                    if not final and last is not None and now - last < stamp[0] / REUPLOAD_BYTES_PER_S:
                        continue
                    self.fs.put_file(os.path.join(self.local, rel), f"{self._root}/{rel.replace(os.sep, '/')}")
                    self._sent[rel] = stamp
                    self._sent_at[rel] = now
                    self.uploads += 1
            except Exception as exc:  # noqa: BLE001 - a store that stops answering must not stop training
                if not self._failing:
                    report_once(f"remote:{self.url}", f"tbmem: uploading the run to {self.url} failed; training "
                                f"goes on, every file is kept in {self.local} and uploads are retried every "
                                f"{self.every_s:g} s ({type(exc).__name__}: {exc})")
                else:
                    logger.debug("tbmem: upload to %s still failing: %s", self.url, exc)
                self._failing = True
                return False
            if self._failing:
                logger.info("tbmem: uploads to %s work again", self.url)
            self._failing = False
            return True

    def _changed(self) -> list[tuple[str, tuple[int, int]]]:
        out = []
        for folder, dirs, files in os.walk(self.local):
            dirs.sort()
            for name in sorted(files):
                if _SKIP.match(name):
                    continue
                path = os.path.join(folder, name)
                try:
                    st = os.stat(path, follow_symlinks=False)
                except OSError:
                    continue  # removed meanwhile (a snapshot over its budget)
                rel = os.path.relpath(path, self.local)
                stamp = (st.st_size, st.st_mtime_ns)
                if self._sent.get(rel) != stamp:
                    out.append((rel, stamp))
        return out

    def close(self, *, timeout_s: float = 60.0) -> bool:
        """Stop the thread and upload what changed since (one round; a failing store is not waited for
        beyond ``timeout_s``). True when the URL holds every file."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
        done: list[bool] = []
        last = threading.Thread(target=lambda: done.append(self.sync(final=True)), name="tbmem-remote-close",
                                daemon=True)
        last.start()
        last.join(timeout=timeout_s)
        return bool(done and done[0])


def upload_file(local: str, url: str) -> None:
    """Copy the file ``local`` to ``url`` (the object replaced whole); raises what the store raises."""
    fs, path = _fs(url)
    fs.put_file(local, path)


def upload_folder(local: str, url: str) -> int:
    """Copy every file below ``local`` to the same relative path below ``url``; how many. Raises
    what the store raises (what was copied before stays)."""
    fs, root = _fs(url.rstrip("/"))
    count = 0
    for folder, dirs, files in os.walk(local):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(folder, name)
            if _SKIP.match(name) or os.path.islink(path):
                continue
            rel = os.path.relpath(path, local).replace(os.sep, "/")
            fs.put_file(path, f"{root}/{rel}")
            count += 1
    return count


def fetch(url: str, local: str | None = None) -> str:
    """Copy the logdir at ``url`` into ``local`` (a new temporary folder by default; a file already
    there with the object's size is kept); returns it."""
    fs, root = _fs(url)
    local = local or tempfile.mkdtemp(prefix="tbmem-fetch-")
    root = root.rstrip("/")
    if not fs.exists(root):
        raise FileNotFoundError(f"{url}: no such logdir")
    for path, info in fs.find(root, detail=True).items():
        rel = path[len(root):].lstrip("/")
        if not rel or any(p in ("", "..", ".") for p in rel.split("/")):
            continue  # an object key that would leave the folder is skipped
        target = os.path.join(local, *rel.split("/"))
        if os.path.isfile(target) and os.path.getsize(target) == info.get("size"):
            continue  # copied before and unchanged (the files tbmem writes only grow or are replaced)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        fs.get_file(path, target)
    return local
