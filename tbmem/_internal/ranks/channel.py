"""A node's rank table, fed by its ranks: local rank 0 receives, every other rank sends.

Part of the compact layout (:mod:`tbmem._internal.ranks.compact`). Each node's local rank 0 receives its
peers' records on a Unix datagram socket (an abstract name per job, node and writer: nothing on
disk) and appends them to ``<job>/ranks/node<n>.parquet`` (:mod:`tbmem._internal.logdir.rank_table`). A peer
encodes a record in binary (a header, each set of tags once by number, the values as float64) and
sends its records in batches, 16 KiB or a second's worth (a thread of its own sends a batch that
waited a second when no record follows), and at close: one datagram per record woke the receiver for
each and cost the sender more than the rest of the channel.
What cannot be sent yet (the receiver not up, its buffer full) is kept and sent later.

Only the job's own processes are heard (any local user can read an abstract name in
``/proc/net/unix``): the receiver binds a random name and writes it, with a random token, into
a rendezvous file only its user can read (``<job>/ranks/.channel-<key>``, in the temporary
folder for a job on a store; :func:`_rendezvous_paths`); a peer reads both there and sends the
token first in every datagram. The kernel tells the receiver each datagram's sender
(``SO_PASSCRED``): one of another user, or without the token, is dropped (said once); a rank's
first process keeps its rank (another process's frames for it are dropped), a set of tags is
numbered once, and tags the table cannot hold are dropped (:func:`tbmem._internal.logdir.rank_table.tag_problem`).

Example:
    >>> import tempfile
    >>> from tbmem._internal.ranks.channel import NodeChannel
    >>> job = tempfile.mkdtemp()
    >>> receiver = NodeChannel(job, rank=0, local_rank=0, local_world=2, instance=7)
    >>> peer = NodeChannel(job, rank=1, local_rank=1, local_world=2, instance=7)
    >>> peer.send(0, {"Memory/RAM/process_rss_GB": 1.5}); peer.close(); receiver.close()
    >>> from tbmem._internal.logdir.rank_table import read_rank_table
    >>> read_rank_table(job).to_pydict()["Memory/RAM/process_rss_GB"]
    [1.5]
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import secrets
import shutil
import socket
import stat
import struct
import tempfile
import threading
import time
from typing import Any, Mapping

from tbmem._internal._log import logger, report_once

__all__ = ["NodeChannel", "node_name"]

_MAX_PENDING = 1_000  # batches (at most _DATAGRAM_MAX each) a peer keeps while its node's receiver is not up
_CLOSE_WAIT_S = 30.0  # how long a node's receiver waits at close for its peers' last records
_FLUSH_S = 5.0  # a row group at most this often while records come in ...
# ... and, as the table grows, less often: each row group rewrites the whole file (a Parquet file
# cannot be appended to and stay readable), so the receiver rewrites at most this many bytes a second
_REWRITE_BYTES_PER_S = 4 << 20
_HEAD = struct.Struct("<biqd")  # kind, rank, step (a set of tags' number for _KEYS), wall time
_KID = struct.Struct("<I")  # a record's set of tags, by number
_FRAME = struct.Struct("<I")  # a frame's length: a datagram holds frames, each a header and its body
_BATCH_BYTES = 16 << 10  # a peer sends its records when this many bytes are waiting ...
_BATCH_S = 1.0  # ... or this many seconds passed since its last send, and at close
_DATAGRAM_MAX = 60 << 10  # well below a Unix datagram's limit (the socket's send buffer, ~208 KiB)
_RECORD, _KEYS, _CLOSED = 1, 2, 3
_TOKEN_BYTES = 16  # the job's token, first in every datagram
_CRED = struct.Struct("iII")  # struct ucred: pid, uid, gid (SCM_CREDENTIALS)
_RENDEZVOUS_TRIES = 3  # rendezvous files a receiver may use, in order (one planted by another user is passed over)


def node_name(environ: Mapping[str, str] | None = None) -> str:
    """This node's name in the rank table's file name: torchrun's ``GROUP_RANK``, else the host."""
    env = os.environ if environ is None else environ
    group = env.get("GROUP_RANK", "")
    return group if group.isdigit() else socket.gethostname().split(".")[0]


def _job_key(job_dir: str, node: str, instance: int) -> str:
    env = os.environ
    job = job_dir if "://" in job_dir else os.path.abspath(job_dir)
    key = "|".join((env.get("TORCHELASTIC_RUN_ID", ""), env.get("TORCHELASTIC_RESTART_COUNT", "0"),
                    env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", ""), job, node, str(instance)))
    return hashlib.sha1(key.encode()).hexdigest()[:24]


def _rendezvous_paths(job_dir: str, node: str, instance: int) -> list[str]:
    """Where the receiver of this job, node and writer publishes its socket's name and token, in order."""
    key = _job_key(job_dir, node, instance)
    if "://" in job_dir:  # a job on a store: the node's temporary folder (its ranks share it)
        folder, name = tempfile.gettempdir(), f"tbmem-channel-{key}"
    else:
        from tbmem._internal.logdir.rank_table import RANK_TABLE_DIR

        folder, name = os.path.join(job_dir, RANK_TABLE_DIR), f".channel-{key}"
    return [os.path.join(folder, f"{name}-{i}") for i in range(_RENDEZVOUS_TRIES)]


def _read_rendezvous(paths: list[str]) -> tuple[bytes, bytes] | None:
    """(address, token) from the first rendezvous file this user owns and only it can read."""
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if st.st_uid != os.getuid() or st.st_mode & 0o077 or not stat.S_ISREG(st.st_mode):
                continue  # planted by another user, or readable by others: not the job's
            doc = json.loads(os.read(fd, 4096))
            return b"\0" + bytes.fromhex(doc["address"]), bytes.fromhex(doc["token"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        finally:
            os.close(fd)
    return None


def _write_rendezvous(paths: list[str], address: bytes, token: bytes) -> str | None:
    """Publish (address, token) in the first of ``paths`` this user can own (mode 0600); its path."""
    doc = json.dumps({"address": address[1:].hex(), "token": token.hex(), "pid": os.getpid()}).encode()
    for path in paths:
        temp = f"{path}.{os.getpid()}.tmp"
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            try:
                os.write(fd, doc)
            finally:
                os.close(fd)
            os.replace(temp, path)
        except OSError:
            try:
                os.unlink(temp)
            except OSError:
                pass
            continue
        if _read_rendezvous([path]) == (address, token):
            return path
    return None


class NodeChannel:
    """Sends this rank's records to its node's rank table; on local rank 0, receives and writes them.

    Args:
        job_dir: The job's folder (the table is ``<job_dir>/ranks/node<n>.parquet``), or its URL (the
            table is written in a temporary folder and uploaded there after each row group).
        rank: This rank. local_rank: Its rank on the node (0 receives). local_world: Ranks on the node.
        instance: The writer's number in its process (the same on every rank).
    """

    def __init__(self, job_dir: str, *, rank: int, local_rank: int, local_world: int, instance: int) -> None:
        node = node_name()
        self.rank, self.local_world = rank, local_world
        self._rendezvous = _rendezvous_paths(job_dir, node, instance)
        self._rendezvous_at: str | None = None  # the receiver's published file
        self._address: bytes | None = None  # the receiver's socket (a peer: read from the rendezvous file)
        self._token = b""
        self._pending: collections.deque[bytes] = collections.deque(maxlen=_MAX_PENDING)
        self._batch = bytearray()
        self._batch_since = time.time()
        self._table: Any = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()  # a peer's batch and pending datagrams: its sending thread and send()
        self._closed_peers: set[int] = set()
        self._keysets: dict[tuple[str, ...], tuple[int, struct.Struct]] = {}  # a sender's sets of tags: number, packer
        self._keys: dict[tuple[int, int], tuple[Any, ...]] = {}  # the receiver's: (rank, number) -> tags
        self._senders: dict[int, int] = {}  # the receiver's: rank -> the pid that first sent for it
        self.foreign = 0  # datagrams the receiver dropped: another user's, or without the job's token
        # the receiver's records not yet in the table: (rank, number) -> (steps, wall times, float64 values)
        self._incoming: dict[tuple[int, int], tuple[list[int], list[float], bytearray]] = {}
        self.dropped = 0
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._upload_failed = False
        self._upload: str | None = None  # a remote job's table: written here, copied there after each row group
        if local_rank == 0:
            from tbmem._internal.logdir.fs import is_url
            from tbmem._internal.logdir.rank_table import RankTableWriter, rank_table_path

            if is_url(job_dir):
                local = tempfile.mkdtemp(prefix="tbmem-ranks-")
                self._table = RankTableWriter(rank_table_path(local, node))
                self._upload = job_dir.rstrip("/") + "/" + os.path.relpath(self._table.path, local).replace(os.sep, "/")
            else:
                self._table = RankTableWriter(rank_table_path(job_dir, node))
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)  # each datagram's sender
            self._token = secrets.token_bytes(_TOKEN_BYTES)
            for _ in range(8):  # a random name: nobody can take it first (a name in use: another)
                self._address = b"\0tbmem-" + secrets.token_hex(12).encode()
                try:
                    self._sock.bind(self._address)
                    break
                except OSError:
                    continue
            else:
                self._sock.bind(b"")  # autobind: the kernel picks a free abstract name
                self._address = self._sock.getsockname()
            self._rendezvous_at = _write_rendezvous(self._rendezvous, self._address, self._token)
            if self._rendezvous_at is None:
                report_once("ranks:table-rendezvous", f"tbmem: the node's rank table cannot publish its socket in "
                            f"{self._rendezvous[0]} (or the {_RENDEZVOUS_TRIES - 1} names after it); its peers' "
                            "records will not reach it")
            self._sock.settimeout(0.2)
            self._thread = threading.Thread(target=self._receive, name="tbmem-rank-table", daemon=True)
            self._thread.start()
        else:
            self._sock.setblocking(False)
            # a batch waits at most about _BATCH_S, also when no record follows (a pause, an evaluation)
            self._thread = threading.Thread(target=self._send_late, name="tbmem-rank-send", daemon=True)
            self._thread.start()

    @property
    def path(self) -> str | None:
        """The node's table on the receiving rank, else None."""
        return self._table.path if self._table is not None else None

    # --- sending (every rank) -----------------------------------------------------------------
    def send(self, step: int, values: Mapping[str, float]) -> None:
        """One record of this rank (its tags in their units)."""
        wall = time.time()
        if self._table is not None:
            self._table.add(self.rank, step, wall, values)
            return
        # binary: a header and the values as float64; each set of tags is sent once, by number
        # (a record as JSON cost 35 us, this 3 us). Records are sent in batches (a datagram per
        # record woke the receiver each time: +7 us a record on a quiet machine, more on a busy one).
        keys = tuple(values)
        with self._lock:
            found = self._keysets.get(keys)
            if found is None:
                found = self._keysets[keys] = (len(self._keysets), struct.Struct(f"<{len(keys)}d"))
                self._add(_HEAD.pack(_KEYS, self.rank, found[0], 0.0) + json.dumps(keys).encode())
            kid, packer = found
            self._add(_HEAD.pack(_RECORD, self.rank, step, wall) + _KID.pack(kid) + packer.pack(*values.values()))
            if len(self._batch) >= _BATCH_BYTES or wall - self._batch_since >= _BATCH_S:
                self._send_batch(wall)

    def _send_late(self) -> None:
        while not self._stop.wait(_BATCH_S / 2):
            with self._lock:
                now = time.time()
                if (self._batch and now - self._batch_since >= _BATCH_S) or self._pending:
                    self._send_batch(now)

    def _add(self, frame: bytes) -> None:
        if len(self._batch) + len(frame) + _FRAME.size > _DATAGRAM_MAX and self._batch:
            self._send_batch(time.time())
        self._batch += _FRAME.pack(len(frame))
        self._batch += frame

    def _send_batch(self, now: float) -> None:
        self._batch_since = now
        if self._batch:
            if len(self._pending) == _MAX_PENDING:
                self.dropped += 1
                report_once("ranks:table-full", f"tbmem: rank {self.rank}'s node receiver has not taken its records "
                            f"for {_MAX_PENDING} batches; the oldest are dropped")
            self._pending.append(bytes(self._batch))
            self._batch.clear()
        self._drain_pending()

    def _drain_pending(self) -> bool:
        pending, sock = self._pending, self._sock
        while pending:
            if self._address is None:
                found = _read_rendezvous(self._rendezvous)
                if found is None:
                    return False  # the receiver is not up yet: next batch
                self._address, self._token = found
            try:
                sock.sendmsg([self._token, pending[0]], (), 0, self._address)
            except (ConnectionRefusedError, FileNotFoundError):
                self._address = None  # a receiver of an earlier job: read the rendezvous file again
                return False
            except (BlockingIOError, InterruptedError):
                return False  # the receiver's buffer is full: next batch
            except OSError as exc:  # a batch too large for one datagram: dropped, said once
                pending.popleft()
                self.dropped += 1
                report_once("ranks:table-send", f"tbmem: records of rank {self.rank} could not be sent to its "
                            "node's rank table", exc=exc)
                continue
            pending.popleft()
        return True

    # --- receiving (local rank 0) -------------------------------------------------------------
    def _receive(self) -> None:
        last_flush = time.monotonic()
        while True:
            try:
                data, ancillary, _, _ = self._sock.recvmsg(1 << 20, socket.CMSG_SPACE(_CRED.size))
            except socket.timeout:
                data = None
            except OSError:
                break
            if data is not None:
                sender = self._sender(data, ancillary)
                if sender is not None:
                    self._take(memoryview(data)[_TOKEN_BYTES:], sender)
            now = time.monotonic()
            every = max(_FLUSH_S, self._table.file_bytes / _REWRITE_BYTES_PER_S)
            if now - last_flush >= every or (data is None and self._stop.is_set()):
                last_flush = now
                self._flush()
                if data is None and self._stop.is_set():
                    break

    def _sender(self, data: bytes, ancillary: list[tuple[int, int, bytes]]) -> int | None:
        """The sending process's pid when the datagram is the job's (this user's, the job's token), else None."""
        pid = uid = None
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(payload) >= _CRED.size:
                pid, uid, _ = _CRED.unpack_from(payload)
        if uid == os.getuid() and secrets.compare_digest(data[:_TOKEN_BYTES], self._token):
            return pid
        self.foreign += 1
        report_once("ranks:table-foreign", f"tbmem: the node's rank table dropped a datagram from a process outside "
                    f"this job (pid {pid}, uid {uid}): only this user's ranks with the job's token are heard")
        return None

    def _take(self, view: memoryview, pid: int) -> None:
        at = 0
        while at < len(view):
            try:
                (size,) = _FRAME.unpack_from(view, at)
                self._take_frame(view[at + _FRAME.size:at + _FRAME.size + size], pid)
            except Exception as exc:  # noqa: BLE001 - a malformed datagram is skipped, never fatal
                report_once("ranks:table-receive", "tbmem: a record for the rank table could not be read", exc=exc)
                return
            at += _FRAME.size + size

    def _take_frame(self, frame: memoryview, pid: int) -> None:
        kind, rank, step, wall = _HEAD.unpack_from(frame)
        body = frame[_HEAD.size:]
        owner = self._senders.setdefault(rank, pid)
        if owner != pid or rank == self.rank:
            report_once("ranks:table-impostor", f"tbmem: the node's rank table dropped frames for rank {rank} from "
                        f"pid {pid} (rank {rank} is pid {owner if rank != self.rank else os.getpid()})")
            return
        if kind == _RECORD:
            kid = _KID.unpack_from(body)[0]
            keys = self._keys[(rank, kid)]
            values = body[_KID.size:]
            if len(values) != 8 * len(keys):
                raise ValueError(f"rank {rank} sent {len(values) // 8} values for {len(keys)} tags")
            # kept as bytes, decoded per rank and set of tags at the next row group (columns at once:
            # a row of Python floats per record cost the receiving rank 11.5 us a record)
            group = self._incoming.get((rank, kid))
            if group is None:
                group = self._incoming[(rank, kid)] = ([], [], bytearray())
            group[0].append(step)
            group[1].append(wall)
            group[2].extend(values)
        elif kind == _KEYS:
            keys = json.loads(bytes(body))
            if not isinstance(keys, list) or (rank, step) in self._keys:
                raise ValueError(f"rank {rank} sent set of tags {step} again, or not a list")
            # a tag that is no name stays in its place (values go by position); the table drops it
            self._keys[(rank, step)] = tuple(k if isinstance(k, (str, int, float)) else None for k in keys)
        elif kind == _CLOSED:
            self._closed_peers.add(rank)

    def _flush(self) -> bool:
        try:
            incoming, self._incoming = self._incoming, {}
            if incoming:
                import numpy as np

                for (rank, kid), (steps, walls, packed) in incoming.items():
                    keys = self._keys[(rank, kid)]
                    values = np.frombuffer(bytes(packed), dtype="<f8").reshape(len(steps), len(keys))
                    self._table.add_block(rank, keys, steps, walls, values)
            groups = self._table.row_groups
            self._table.flush()
        except Exception as exc:  # noqa: BLE001 - a full disk must not end the run
            report_once("ranks:table-write", f"tbmem: writing the rank table {self._table.path} failed", exc=exc)
            return False
        if self._upload is None or self._table.row_groups == groups == 0:
            return True
        from tbmem._internal.logdir.fs import upload_file

        try:
            if self._table.row_groups != groups or self._upload_failed:
                upload_file(self._table.path, self._upload)
            self._upload_failed = False
            return True
        except Exception as exc:  # noqa: BLE001 - a store that stops answering must not end the run
            self._upload_failed = True
            report_once("ranks:table-upload", f"tbmem: uploading the rank table to {self._upload} failed; training "
                        f"goes on, the table is kept in {self._table.path} and uploads are retried", exc=exc)
            return False

    # --- closing ------------------------------------------------------------------------------
    def close(self, *, wait_s: float = _CLOSE_WAIT_S) -> None:
        """A peer: send what is left and say so. The receiver: wait for its peers, write the table."""
        deadline = time.monotonic() + wait_s
        if self._table is None:
            self._stop.set()
            if self._thread is not None:
                self._thread.join()
            self._add(_HEAD.pack(_CLOSED, self.rank, 0, 0.0))
            self._send_batch(time.time())
            while not self._drain_pending() and time.monotonic() < deadline:
                time.sleep(0.05)
            if self._pending:
                report_once("ranks:table-lost", f"tbmem: {len(self._pending)} batch(es) of records of rank {self.rank} "
                            "could not reach its node's rank table (no tbmem writer on local rank 0?)")
            self._sock.close()
            return
        while len(self._closed_peers) < self.local_world - 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(deadline - time.monotonic(), 1.0) + 5.0)
        self._sock.close()
        if self._rendezvous_at is not None:
            try:
                os.unlink(self._rendezvous_at)
            except OSError:
                pass
        if self._flush() and self._upload is not None:  # the table is on the store: no local copy left
            shutil.rmtree(os.path.dirname(os.path.dirname(self._table.path)), ignore_errors=True)
        logger.debug("tbmem: rank table %s: %d rows", self._upload or self._table.path, self._table.rows)
