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
quietly; what was uploaded before stays readable there. A store that accepts connections and never
answers is bounded too: S3 requests time out (:data:`CONNECT_TIMEOUT_S`, :data:`READ_TIMEOUT_S`, two
attempts), a round that overruns :data:`ROUND_WARN_S` is one line, and :meth:`RemoteMirror.close`
keeps one deadline for all its waiting and names the folder that keeps the run when it passes.

The store's address and credentials are fsspec's and its backend's: for S3, ``AWS_ENDPOINT_URL``
(a local or S3-compatible server), ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` or a profile.
TensorBoard reads the event files of ``s3://`` itself (``S3_ENDPOINT`` for its own S3 client).

Example:
    >>> from tbmem._internal.logdir.fs import is_url
    >>> is_url("s3://bucket/run"), is_url("gs://b/r"), is_url("runs/exp"), is_url("/tmp/x")
    (True, True, False, False)
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import threading
import time
from typing import Any, Iterator

from tbmem._internal._extras import require
from tbmem._internal._log import logger, report_once

__all__ = ["is_url", "RemoteMirror", "fetch", "fetched", "join_url", "upload_file", "upload_folder",
           "CONNECT_TIMEOUT_S", "READ_TIMEOUT_S", "ROUND_WARN_S"]

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_SKIP = re.compile(r"^(\.tmp-|\.tbmem-write-test-)")  # files being written: uploaded once renamed
# An object store cannot append: a grown event file is uploaded whole again. A file uploaded before
# waits size / this many seconds (at least every_s) before it is uploaded again, so that a long
# run's growing files cost at most about this many bytes a second each; close() uploads everything.
REUPLOAD_BYTES_PER_S = 1 << 20
#: An S3 store's connect and read timeouts (each request, two attempts; ``TBMEM_REMOTE_TIMEOUT_S``
#: sets the read timeout, and the connect timeout up to it): a silent store fails, never hangs.
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 30.0
#: An upload round longer than this is one line (the store is slow or silent).
ROUND_WARN_S = 120.0


def is_url(path: Any) -> bool:
    """Whether ``path`` is a URL (``s3://...``), not a local path (``file://`` counts as a URL)."""
    return isinstance(path, str) and bool(_URL.match(path))


def join_url(url: str, *parts: str) -> str:
    """``url`` with ``parts`` appended, ``/``-separated."""
    return "/".join([url.rstrip("/"), *(p.strip("/") for p in parts if p)])


def _timeouts() -> tuple[float, float]:
    try:
        read = float(os.environ.get("TBMEM_REMOTE_TIMEOUT_S", READ_TIMEOUT_S))
    except ValueError:
        read = READ_TIMEOUT_S
    return min(CONNECT_TIMEOUT_S, read), read


def _call(fs: Any, method: str, *args: Any, size: int = 0, **kwargs: Any) -> Any:
    """``fs.<method>(*args)``, bounded: an asynchronous file system (s3fs, gcsfs) is given a deadline
    for the whole call (a store that accepts and never answers held s3fs's calls past its own
    timeouts), the read timeout twice plus a second per 256 KiB of ``size``."""
    if not getattr(fs, "async_impl", False):
        return getattr(fs, method)(*args, **kwargs)
    deadline = 2 * _timeouts()[1] + size / (256 << 10)
    try:
        return getattr(fs, method)(*args, timeout=deadline, **kwargs)
    except Exception as exc:
        if type(exc).__name__ == "FSTimeoutError":
            raise TimeoutError(f"the store did not answer within {deadline:.0f} s ({method})") from None
        raise


def _fs(url: str) -> tuple[Any, str]:
    fsspec = require("fsspec", extra="remote")
    options: dict[str, Any] = {}
    if url.split("://", 1)[0] in ("s3", "s3a"):  # botocore waits 60 s a read and retries: bounded here
        connect, read = _timeouts()
        options["config_kwargs"] = {"connect_timeout": connect, "read_timeout": read,
                                    "retries": {"max_attempts": 2, "mode": "standard"}}
    return fsspec.core.url_to_fs(url, **options)


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
            began = time.monotonic()
            try:
                return self._round(final)
            finally:
                took = time.monotonic() - began
                if took > ROUND_WARN_S:
                    report_once(f"remote-slow:{self.url}", f"tbmem: an upload round to {self.url} took {took:.0f} s "
                                f"(the store is slow or does not answer); every file is kept in {self.local}")

    def _round(self, final: bool) -> bool:
        """The uploads of one round (under the lock :meth:`sync` holds)."""
        try:
            now = time.monotonic()
            for rel, stamp in self._changed():
                last = self._sent_at.get(rel)
                if not final and last is not None and now - last < stamp[0] / REUPLOAD_BYTES_PER_S:
                    continue
                _call(self.fs, "put_file", os.path.join(self.local, rel), f"{self._root}/{rel.replace(os.sep, '/')}",
                      size=stamp[0])
                self._sent[rel] = stamp
                self._sent_at[rel] = now
                self.uploads += 1
        except Exception as exc:
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
        """Stop the thread and upload what changed since (one round); all of it within ``timeout_s``
        (a round still running then is left to its daemon thread, and one line names the folder that
        keeps the run). True when the URL holds every file."""
        deadline = time.monotonic() + timeout_s
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
        done: list[bool] = []
        last = threading.Thread(target=lambda: done.append(self.sync(final=True)), name="tbmem-remote-close",
                                daemon=True)
        last.start()
        last.join(timeout=max(deadline - time.monotonic(), 0.0))
        if not done:
            report_once(f"remote-close:{self.url}", f"tbmem: the store at {self.url} did not take the run's last "
                        f"files within {timeout_s:g} s of close(); the whole run is kept in {self.local}")
        elif not done[0]:
            logger.warning("tbmem: the run's last files did not reach %s; the whole run is kept in %s",
                           self.url, self.local)
        return bool(done and done[0])


def upload_file(local: str, url: str) -> None:
    """Copy the file ``local`` to ``url`` (the object replaced whole); raises what the store raises."""
    fs, path = _fs(url)
    _call(fs, "put_file", local, path, size=os.path.getsize(local))


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
            _call(fs, "put_file", path, f"{root}/{rel}", size=os.path.getsize(path))
            count += 1
    return count


@contextlib.contextmanager
def fetched(url: str) -> Iterator[str]:
    """The logdir at ``url`` copied into a new temporary folder for the block, removed after it
    (also when the copy or the block fails): a reader leaves nothing in the temporary folder.

    Example:
        >>> import os, pathlib, tempfile
        >>> src = tempfile.mkdtemp(); _ = pathlib.Path(src, "a.txt").write_text("x")
        >>> with fetched("file://" + src) as local:
        ...     sorted(os.listdir(local))
        ['a.txt']
        >>> os.path.exists(local)
        False
    """
    local = tempfile.mkdtemp(prefix="tbmem-fetch-")
    try:
        try:
            fetch(url, local)
        except FileNotFoundError:
            raise
        except Exception as exc:
            raise OSError(f"{url}: cannot copy the logdir ({type(exc).__name__}: {exc})") from exc
        yield local
    finally:
        shutil.rmtree(local, ignore_errors=True)


def fetch(url: str, local: str | None = None) -> str:
    """Copy the logdir at ``url`` into ``local`` (a new temporary folder by default; a file already
    there with the object's size is kept); returns it."""
    fs, root = _fs(url)
    local = local or tempfile.mkdtemp(prefix="tbmem-fetch-")
    root = root.rstrip("/")
    if not _call(fs, "exists", root):
        raise FileNotFoundError(f"{url}: no such logdir")
    for path, info in _call(fs, "find", root, detail=True).items():
        rel = path[len(root):].lstrip("/")
        if not rel or any(p in ("", "..", ".") for p in rel.split("/")):
            continue  # an object key that would leave the folder is skipped
        target = os.path.join(local, *rel.split("/"))
        if os.path.isfile(target) and os.path.getsize(target) == info.get("size"):
            continue  # copied before and unchanged (the files tbmem writes only grow or are replaced)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        _call(fs, "get_file", path, target, size=int(info.get("size") or 0))
    return local
