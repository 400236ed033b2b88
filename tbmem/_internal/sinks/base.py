"""The sink protocol, and the background sink that keeps a tracker's calls off the training thread.

A sink receives what :class:`tbmem.MemoryWriter` writes: each event's scalars (``log``), its text
entries such as the census table (``log_text``) and the files it writes beside the run, such as
snapshots (``log_artifact``). TensorBoard's event file is a sink too, the first one and built in
(:class:`tbmem.TensorBoardSink`); every sink gets the same values on the same steps.

A tracker's client (``wandb``, ``mlflow``) may block for seconds: it starts a service process,
retries a rate-limited request with backoff, waits on a network that is gone. So
:class:`BackgroundSink` only appends to a queue on the calling thread; a thread of its own opens the
tracker's run and sends the queue in batches. The first error there is reported once
(:func:`tbmem.report_once`), the sink is switched off and what it still held is dropped:
training and the other sinks go on, and TensorBoard's file has every record.

Example:
    >>> from tbmem._internal.sinks.base import BackgroundSink
    >>> class ListSink(BackgroundSink):
    ...     name = "list"
    ...     def _open(self): self.got = []
    ...     def _send(self, items): self.got.extend(items)
    >>> sink = ListSink()
    >>> sink.log({"Memory/RAM/process_rss_GB": 1.5}, step=10)
    >>> sink.close()
    >>> sink.got
    [('scalars', {'Memory/RAM/process_rss_GB': 1.5}, 10)]
"""

from __future__ import annotations

import collections
import os
import shutil
import tempfile
import threading
from typing import Any, Protocol, runtime_checkable

from tbmem._internal._log import report_once
from tbmem._internal.logdir.traces import TRACES_DIR

__all__ = ["Sink", "BackgroundSink", "SinkFailed", "Item", "RANK_MODES", "rank_scope", "sent_name"]

#: Which ranks of a job send to a tracker: rank 0 only, or a run per rank.
RANK_MODES = ("rank0", "per_rank")

def sent_name(path: str) -> str:
    """The name a file is sent to a tracker under: its own, or for a profile trace its window's folder
    and its own (every window's trace of rank r is ``rank<r>.pt.trace.json.gz``; one name would keep
    one window).

    Example:
        >>> sent_name("run/plugins/tbmem/traces/step000000004/rank0.pt.trace.json.gz")
        'step000000004_rank0.pt.trace.json.gz'
    """
    name = os.path.basename(path)
    window = os.path.dirname(path)
    if os.path.basename(os.path.dirname(window)) == TRACES_DIR:
        return f"{os.path.basename(window)}_{name}"
    return name


def rank_scope(owner: str, ranks: str, *, joined: bool) -> tuple[Any, bool]:
    """This process's rank (:func:`tbmem.detect_rank`) and whether ``owner``'s sink sends
    from it: a joined run or ``"per_rank"`` on every rank, else rank 0 only (another rank's records
    reach rank 0's run as aggregates). ValueError for a ``ranks`` not in :data:`RANK_MODES`."""
    if ranks not in RANK_MODES:
        raise ValueError(f"{owner}.ranks must be one of {RANK_MODES}, got {ranks!r}")
    from tbmem._internal.ranks.context import detect_rank

    rank = detect_rank()
    return rank, joined or ranks == "per_rank" or rank.is_root


#: What a background sink queues: ``("scalars", {tag: value}, step)``, ``("text", (tag, text), step)``
#: or ``("artifact", (path, kind), -1)``.
Item = tuple[str, Any, int]


@runtime_checkable
class Sink(Protocol):
    """What :class:`tbmem.MemoryWriter` calls on each sink (none of these may block training)."""

    def log(self, values: dict[str, float], step: int) -> None:
        """The scalars of one event, ``{tag: value}``, at the training step ``step``."""

    def log_text(self, tag: str, text: str, step: int) -> None:
        """A text entry (markdown; the census table) at ``step``."""

    def log_artifact(self, path: str, kind: str) -> None:
        """A file of the run (``kind``: ``"snapshot"``, ``"trace"``); it may be removed after this call."""

    def close(self) -> None:
        """Send what is left and end the sink's own run (a joined run is left open)."""


class SinkFailed(RuntimeError):
    """A tracker refused what a sink sent (a closed run, a rejected request)."""


class BackgroundSink:
    """A sink whose tracker calls run on a thread of its own; subclasses implement ``_open``/``_send``.

    A subclass sets its own attributes before it calls ``super().__init__``, which starts the thread.

    Args:
        flush_every_s: How often the thread sends what was queued (a batch per interval).
        close_timeout_s: How long :meth:`close` waits for the thread to send the rest and end the run.
        max_pending: Items queued at most; beyond, the oldest are dropped (the tracker cannot keep up).
        active: False: the sink ignores every call and starts no thread (another rank's, say).
    """

    name = "sink"

    def __init__(self, *, flush_every_s: float = 1.0, close_timeout_s: float = 30.0,
                 max_pending: int = 100_000, active: bool = True) -> None:
        self.flush_every_s = float(flush_every_s)
        self.close_timeout_s = float(close_timeout_s)
        self._queue: collections.deque[Item] = collections.deque(maxlen=max_pending)
        self._wake = threading.Event()
        self._stop = False
        self.off = not active  #: True once the sink failed (or was closed): calls are ignored
        self.error: str | None = None  #: the failure that switched the sink off
        self._staging: str | None = None
        self._thread = threading.Thread(target=self._run, name=f"tbmem-sink-{self.name}", daemon=True)
        if active:
            self._thread.start()

    # --- the calling thread: append only -------------------------------------------------
    def log(self, values: dict[str, float], step: int) -> None:
        if not self.off:
            self._queue.append(("scalars", dict(values), int(step)))

    def log_text(self, tag: str, text: str, step: int) -> None:
        if not self.off:
            self._queue.append(("text", (tag, text), int(step)))

    def log_artifact(self, path: str, kind: str) -> None:
        """Queue ``path``; a hard link (or a copy) is kept, as the run may prune the file before it is sent."""
        if self.off:
            return
        try:
            if self._staging is None:
                self._staging = tempfile.mkdtemp(prefix=f"tbmem-{self.name}-")
            folder = os.path.join(self._staging, str(len(os.listdir(self._staging))))
            os.mkdir(folder)  # one folder per file: the file keeps its own name
            kept = os.path.join(folder, sent_name(path))
            try:
                os.link(path, kept)
            except OSError:
                shutil.copyfile(path, kept)
        except OSError as exc:
            report_once(f"sink:{self.name}:artifact", f"tbmem: the {self.name} sink could not keep {path} "
                        "to send it; it is not sent", exc=exc)
            return
        self._queue.append(("artifact", (kept, kind, path), -1))
        self._wake.set()

    def close(self) -> None:
        """Send the rest and end the run, waiting at most ``close_timeout_s``; never raises."""
        if self._thread.ident is None:  # never started: an inactive sink
            return
        self._stop = True
        self._wake.set()
        self._thread.join(self.close_timeout_s)
        if self._thread.is_alive() and not self.off:
            self.off = True
            report_once(f"sink:{self.name}:{id(self)}:close",
                        f"tbmem: the {self.name} sink did not finish within {self.close_timeout_s:g} s; what "
                        f"it had not sent is dropped (TensorBoard's records are complete)")
        if self._staging is not None and not self._thread.is_alive():
            shutil.rmtree(self._staging, ignore_errors=True)

    # --- the sink's thread ------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._open()
            while True:
                stop = self._stop
                self._drain()
                if stop:
                    break
                self._wake.wait(self.flush_every_s)
                self._wake.clear()
            self.off = True
            self._finish()
        except BaseException as exc:  # noqa: BLE001 - a tracker's error never reaches training
            self._failed(exc)

    def _drain(self) -> None:
        queue = self._queue
        items = [queue.popleft() for _ in range(len(queue))]
        if items:
            self._send(items)

    def _failed(self, exc: BaseException) -> None:
        self.off = True
        self.error = f"{type(exc).__name__}: {exc}"
        self._queue.clear()
        report_once(f"sink:{self.name}:{id(self)}", f"tbmem: the {self.name} sink failed and is switched off; "
                    "training goes on and TensorBoard's records are complete", exc=exc)
        try:
            self._abandon()
        except BaseException:  # noqa: BLE001 - already reported: the sink is off
            pass

    # --- subclasses -------------------------------------------------------------------------
    def _open(self) -> None:
        """Open or join the tracker's run (on the sink's thread)."""

    def _send(self, items: list[Item]) -> None:
        """Send a batch of queued items in order; raise on a refusal."""
        raise NotImplementedError

    def _finish(self) -> None:
        """End the run this sink started (after the last batch)."""

    def _abandon(self) -> None:
        """After a failure: end the run quietly if possible."""
