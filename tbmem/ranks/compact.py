"""The compact layout of a large job: one TensorBoard run for the job, runs for the ranks that matter.

Under ``RanksConfig(layout="compact")`` (the default above ``compact_above`` ranks):

- rank 0 writes ``<job>/rank0`` as in the per-rank layout: its records, the cross-rank aggregates
  (``Ranks/<tag>/max|min|mean|argmax``) and the ``tbmem: ranks`` charts (the min..max band).
- every other rank writes its TensorBoard run into a private folder outside the logdir (its
  ``staging`` folder, in the temporary directory): nothing for TensorBoard to list or poll.
  At ``close`` the run is moved to ``<job>/rank<r>`` when the rank matters (it held the peak of
  VRAM or RSS in some record, rank 0 says so through the job's store; or it ran out of memory,
  wrote a snapshot after a peer's out-of-memory error, or fired an alert), else deleted.
- every rank's records go to its node's rank table, ``<job>/ranks/node<n>.parquet``
  (:mod:`tbmem.logdir.rank_table`): each node's local rank 0 receives its peers' records on a
  Unix datagram socket (an abstract name, nothing on disk) and appends them; a peer's send is a
  non-blocking system call, and what cannot be sent yet (the receiver not up) is kept and sent
  at the next record or at close.

Example:
    >>> from tbmem.ranks.compact import PeakRanks
    >>> peaks = PeakRanks()
    >>> peaks.see({"Ranks/Memory/RAM/process_rss_GB/max": 2.0, "Ranks/Memory/RAM/process_rss_GB/argmax": 3.0})
    >>> peaks.see({"Ranks/Memory/RAM/process_rss_GB/max": 1.0, "Ranks/Memory/RAM/process_rss_GB/argmax": 5.0})
    >>> peaks.ranks()
    [3]
"""

from __future__ import annotations

import array
import collections
import hashlib
import json
import os
import shutil
import socket
import struct
import threading
import time
from typing import Any, Mapping

from tbmem._log import logger, report_once
from tbmem.tags import TAGS, ranks_tag

__all__ = ["PeakRanks", "NodeChannel", "node_name", "move_run", "PEAK_READINGS"]

#: The readings whose peak rank keeps its TensorBoard run: VRAM (peak allocated, else allocated) and RSS.
PEAK_READINGS = (("vram_peak_allocated", "vram_allocated"), ("ram_rss",), ("ram_tree_rss",))
_MAX_PENDING = 100_000  # records a peer keeps while its node's receiver is not up
_CLOSE_WAIT_S = 30.0  # how long a node's receiver waits at close for its peers' last records
_FLUSH_S = 5.0  # a row group at most this often while records come in
_HEAD = struct.Struct("<biqd")  # kind, rank, step (a set of tags' number for _KEYS), wall time
_RECORD, _KEYS, _CLOSED = 1, 2, 3


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


def node_name(environ: Mapping[str, str] | None = None) -> str:
    """This node's name in the rank table's file name: torchrun's ``GROUP_RANK``, else the host."""
    env = os.environ if environ is None else environ
    group = env.get("GROUP_RANK", "")
    return group if group.isdigit() else socket.gethostname().split(".")[0]


def _address(job_dir: str, node: str, instance: int) -> bytes:
    env = os.environ
    key = "|".join((env.get("TORCHELASTIC_RUN_ID", ""), env.get("TORCHELASTIC_RESTART_COUNT", "0"),
                    env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", ""), os.path.abspath(job_dir), node,
                    str(instance)))
    return b"\0tbmem-" + hashlib.sha1(key.encode()).hexdigest()[:24].encode()  # Linux's abstract namespace


class NodeChannel:
    """Sends this rank's records to its node's rank table; on local rank 0, receives and writes them.

    Args:
        job_dir: The job's folder (the table is ``<job_dir>/ranks/node<n>.parquet``).
        rank: This rank. local_rank: Its rank on the node (0 receives). local_world: Ranks on the node.
        instance: The writer's number in its process (the same on every rank).
    """

    def __init__(self, job_dir: str, *, rank: int, local_rank: int, local_world: int, instance: int) -> None:
        node = node_name()
        self.rank, self.local_world = rank, local_world
        self._address = _address(job_dir, node, instance)
        self._pending: collections.deque[bytes] = collections.deque(maxlen=_MAX_PENDING)
        self._table: Any = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._closed_peers: set[int] = set()
        self._keysets: dict[tuple[str, ...], int] = {}  # a sender's sets of tags, numbered
        self._keys: dict[tuple[int, int], tuple[str, ...]] = {}  # the receiver's: (rank, number) -> tags
        self.dropped = 0
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        if local_rank == 0:
            from tbmem.logdir.rank_table import RankTableWriter, rank_table_path

            self._table = RankTableWriter(rank_table_path(job_dir, node))
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
            self._sock.bind(self._address)
            self._sock.settimeout(0.2)
            self._thread = threading.Thread(target=self._receive, name="tbmem-rank-table", daemon=True)
            self._thread.start()
        else:
            self._sock.setblocking(False)

    @property
    def path(self) -> str | None:
        """The node's table on the receiving rank, else None."""
        return self._table.path if self._table is not None else None

    # --- sending (every rank) -----------------------------------------------------------------
    def send(self, step: int, values: Mapping[str, float]) -> None:
        """One record of this rank (its tags in their units)."""
        if self._table is not None:
            self._table.add(self.rank, step, time.time(), values)
            return
        # binary: a header and the values as float64; each set of tags is sent once, by number
        # (a record as JSON cost 35 us, this 3 us)
        keys = tuple(values)
        kid = self._keysets.get(keys)
        if kid is None:
            kid = self._keysets[keys] = len(self._keysets)
            self._pending.append(_HEAD.pack(_KEYS, self.rank, kid, 0.0) + json.dumps(keys).encode())
        self._pending.append(_HEAD.pack(_RECORD, self.rank, step, time.time()) + kid.to_bytes(4, "little")
                             + array.array("d", values.values()).tobytes())
        self._drain_pending()

    def _drain_pending(self) -> bool:
        pending, sock = self._pending, self._sock
        while pending:
            try:
                sock.sendto(pending[0], self._address)
            except (BlockingIOError, ConnectionRefusedError, FileNotFoundError, InterruptedError):
                return False  # the receiver is not up yet, or its buffer is full: next record
            except OSError as exc:  # a record too large for one datagram: dropped, said once
                pending.popleft()
                self.dropped += 1
                report_once("ranks:table-send", f"tbmem: a record of rank {self.rank} could not be sent to its "
                            "node's rank table", exc=exc)
                continue
            pending.popleft()
        return True

    # --- receiving (local rank 0) -------------------------------------------------------------
    def _receive(self) -> None:
        last_flush = time.monotonic()
        while True:
            try:
                data = self._sock.recv(1 << 20)
            except socket.timeout:
                data = None
            except OSError:
                break
            if data is not None:
                self._take(data)
            now = time.monotonic()
            if now - last_flush >= _FLUSH_S or (data is None and self._stop.is_set()):
                last_flush = now
                self._flush()
                if data is None and self._stop.is_set():
                    break

    def _take(self, data: bytes) -> None:
        try:
            kind, rank, step, wall = _HEAD.unpack_from(data)
            body = data[_HEAD.size:]
            if kind == _RECORD:
                keys = self._keys[(rank, int.from_bytes(body[:4], "little"))]
                values = array.array("d", body[4:]).tolist()
                self._table.add(rank, step, wall, dict(zip(keys, values)))
            elif kind == _KEYS:
                self._keys[(rank, step)] = tuple(json.loads(body))
            elif kind == _CLOSED:
                self._closed_peers.add(rank)
        except Exception as exc:  # noqa: BLE001 - a malformed datagram is skipped, never fatal
            report_once("ranks:table-receive", "tbmem: a record for the rank table could not be read", exc=exc)

    def _flush(self) -> None:
        try:
            self._table.flush()
        except Exception as exc:  # noqa: BLE001 - a full disk must not end the run
            report_once("ranks:table-write", f"tbmem: writing the rank table {self._table.path} failed", exc=exc)

    # --- closing ------------------------------------------------------------------------------
    def close(self, *, wait_s: float = _CLOSE_WAIT_S) -> None:
        """A peer: send what is left and say so. The receiver: wait for its peers, write the table."""
        deadline = time.monotonic() + wait_s
        if self._table is None:
            self._pending.append(_HEAD.pack(_CLOSED, self.rank, 0, 0.0))
            while not self._drain_pending() and time.monotonic() < deadline:
                time.sleep(0.05)
            if self._pending:
                report_once("ranks:table-lost", f"tbmem: {len(self._pending)} record(s) of rank {self.rank} "
                            "could not reach its node's rank table (no tbmem writer on local rank 0?)")
            self._sock.close()
            return
        while len(self._closed_peers) < self.local_world - 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(deadline - time.monotonic(), 1.0) + 5.0)
        self._sock.close()
        self._flush()
        logger.debug("tbmem: rank table %s: %d rows", self._table.path, self._table.rows)


def move_run(staging: str, final: str) -> None:
    """Move a rank's staged run into the job (across file systems too), replacing nothing."""
    os.makedirs(os.path.dirname(final) or ".", exist_ok=True)
    if os.path.exists(final):
        for name in os.listdir(staging):
            shutil.move(os.path.join(staging, name), os.path.join(final, name))
        shutil.rmtree(staging, ignore_errors=True)
    else:
        shutil.move(staging, final)
