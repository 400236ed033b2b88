"""The compact layout's node receiver hears only its job: other users, forged frames, bad tags, a taken name.

The other-user cases need root (CI runs as root): a child drops to ``nobody`` and sends forged
datagrams to the receiver's abstract socket (whose name any local user reads in /proc/net/unix).
Elsewhere they are skipped with the reason. Every child is bounded in time.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import socket
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("pyarrow", reason="the rank table needs pyarrow (tbmem[ranks])")

from tbmem._internal.logdir.rank_table import read_rank_table
from tbmem._internal.ranks import channel
from tbmem._internal.ranks.channel import NodeChannel

TAG = "Memory/RAM/process_rss_GB"

# A forger that knows the frame format (it is in the source) but not the job's token or uid.
_FORGER = r"""
import json, socket, struct, sys
head = struct.Struct("<biqd"); frame = struct.Struct("<I")
def frames(*fs):
    return b"".join(frame.pack(len(f)) + f for f in fs)
keys = head.pack(2, 1, 0, 0.0) + json.dumps(["rank", "Forged/tag", "x"]).encode()  # rank 1's set of tags 0
keys2 = head.pack(2, 4242, 0, 0.0) + json.dumps(["Forged/tag"]).encode()
record = head.pack(1, 4242, 7, 1.0) + struct.pack("<I", 0) + struct.pack("<d", 99.0)
closed = head.pack(3, 1, 0, 0.0)  # "rank 1 closed": would end local rank 0's wait early
address = bytes.fromhex(sys.argv[1])
sent = 0
with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
    for payload in (frames(keys, keys2, record, closed), b"\0" * 16 + frames(keys, keys2, record, closed)):
        sock.sendto(payload, address); sent += 1
print(sent)
"""


def _as_nobody() -> int:
    if os.geteuid() != 0:
        pytest.skip("needs root to run a child as another user (CI runs as root)")
    try:
        return pwd.getpwnam("nobody").pw_uid
    except KeyError:
        pytest.skip("no user 'nobody' to run the other-user child as")


def _forge(address: bytes, uid: int) -> None:
    def drop() -> None:
        os.setgid(65534)
        os.setuid(uid)

    # the forger needs the standard library only: a Python the other user can run (root's own may be private)
    for python in ("/usr/bin/python3", sys.executable):
        try:
            proc = subprocess.run([python, "-I", "-c", _FORGER, address.hex()], check=False, capture_output=True,
                                  text=True, timeout=30, preexec_fn=drop, cwd="/", env={"PATH": "/usr/bin:/bin"})
            break
        except (PermissionError, FileNotFoundError):
            continue
    else:
        pytest.skip("no Python the user 'nobody' may run")
    assert proc.returncode == 0 and proc.stdout.strip() == "2", proc.stderr


def _wait(cond, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.05)


def test_another_user_cannot_add_rows_silence_a_rank_or_end_the_wait(tmp_path, monkeypatch, caplog):
    uid = _as_nobody()
    monkeypatch.setattr(channel, "_FLUSH_S", 0.05)
    job = str(tmp_path / "job")
    os.chmod(tmp_path, 0o755)
    receiver = NodeChannel(job, rank=0, local_rank=0, local_world=2, instance=301)
    peer = NodeChannel(job, rank=1, local_rank=1, local_world=2, instance=301)
    for step in range(5):
        peer.send(step, {TAG: 1.0 + step})
    peer._send_batch(time.time())
    _wait(lambda: receiver._table.rows >= 5)
    _forge(receiver._address, uid)
    time.sleep(0.5)  # the forged datagrams are taken
    for step in range(5, 10):  # after the forged set of tags and "closed": still heard, and waited for
        peer.send(step, {TAG: 1.0 + step})
    closing = threading.Thread(target=receiver.close, kwargs={"wait_s": 20})
    closing.start()
    time.sleep(0.5)
    assert closing.is_alive(), "a forged 'closed' ended local rank 0's wait for its peer"
    peer.close(wait_s=20)
    closing.join(30)
    table = read_rank_table(job).to_pydict()
    assert sorted(set(table["rank"])) == [1]
    assert table["step"] == list(range(10)) and table[TAG] == [1.0 + s for s in range(10)]
    assert "Forged/tag" not in table
    assert receiver.foreign >= 1
    said = [r.getMessage() for r in caplog.records if "outside this job" in r.getMessage()]
    assert len(said) == 1 and f"uid {uid}" in said[0]


def test_a_tag_named_like_a_key_column_or_not_a_string_is_dropped_and_the_table_stays_whole(tmp_path, caplog):
    job = str(tmp_path / "job")
    receiver = NodeChannel(job, rank=0, local_rank=0, local_world=2, instance=302)
    peer = NodeChannel(job, rank=1, local_rank=1, local_world=2, instance=302)
    peer.send(0, {"rank": 5.0, TAG: 1.0})
    peer.send(1, {TAG: 2.0, 7: 3.0})  # type: ignore[dict-item]
    peer.send(2, {"step": 1.0, "wall_time": 2.0, TAG: 3.0})
    peer.send(3, {TAG: 4.0})
    receiver.send(0, {"step": 9.0, TAG: 0.5})
    peer.close(wait_s=20)
    receiver.close(wait_s=20)
    table = read_rank_table(job).to_pydict()
    assert sorted(table) == sorted(["rank", "step", "wall_time", TAG])
    assert list(zip(table["rank"], table["step"], table[TAG])) == [(0, 0, 0.5), (1, 0, 1.0), (1, 1, 2.0),
                                                                    (1, 2, 3.0), (1, 3, 4.0)]
    said = [r.getMessage() for r in caplog.records if "tag" in r.getMessage() and "dropped" in r.getMessage()]
    assert len(said) == 1, said


def _legacy_name(job: str, node: str, instance: int) -> bytes:
    env = os.environ
    key = "|".join((env.get("TORCHELASTIC_RUN_ID", ""), env.get("TORCHELASTIC_RESTART_COUNT", "0"),
                    env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", ""), os.path.abspath(job), node, str(instance)))
    return b"\0tbmem-" + hashlib.sha1(key.encode()).hexdigest()[:24].encode()


def test_a_socket_name_taken_first_does_not_stop_the_table(tmp_path):
    job = str(tmp_path / "job")
    squatter = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:  # the name a job's run id predicted, bound before the job starts
        squatter.bind(_legacy_name(job, channel.node_name(), 303))
        receiver = NodeChannel(job, rank=0, local_rank=0, local_world=2, instance=303)
        peer = NodeChannel(job, rank=1, local_rank=1, local_world=2, instance=303)
        peer.send(0, {TAG: 1.0})
        peer.close(wait_s=20)
        receiver.close(wait_s=20)
    finally:
        squatter.close()
    assert read_rank_table(job).to_pydict()[TAG] == [1.0]


def test_a_rendezvous_file_planted_by_another_user_is_passed_over(tmp_path):
    uid = _as_nobody()
    job = str(tmp_path / "job")
    first = channel._rendezvous_paths(job, channel.node_name(), 304)[0]
    os.makedirs(os.path.dirname(first))
    with open(first, "w") as fh:
        fh.write('{"address": "00", "token": "00"}')
    os.chown(first, uid, -1)
    os.chmod(first, 0o600)
    receiver = NodeChannel(job, rank=0, local_rank=0, local_world=2, instance=304)
    peer = NodeChannel(job, rank=1, local_rank=1, local_world=2, instance=304)
    peer.send(0, {TAG: 1.0})
    peer.close(wait_s=20)
    receiver.close(wait_s=20)
    assert read_rank_table(job).to_pydict()[TAG] == [1.0]
    assert not [n for n in os.listdir(os.path.dirname(first)) if n.startswith(".channel") and n != os.path.basename(first)]
