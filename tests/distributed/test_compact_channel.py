"""tbmem._internal.ranks.compact.NodeChannel: a peer's records reach its node's rank table whole, in batches."""

from __future__ import annotations

import pytest

pytest.importorskip("pyarrow", reason="the rank table needs pyarrow (tbmem[ranks])")

from tbmem._internal.logdir.rank_table import read_rank_table  # noqa: E402
from tbmem._internal.ranks import channel, compact  # noqa: E402
from tbmem._internal.ranks.compact import NodeChannel  # noqa: E402


def _records(rank: int, n: int) -> list[tuple[int, dict[str, float]]]:
    out = []
    for step in range(n):
        values = {"Memory/RAM/process_rss_GB": rank + step / 1e3, "Memory/RAM/system_used_GB": float(step)}
        if step % 3 == 0:  # a second set of tags, as when a census or a probe adds its readings
            values["Memory/Census/other_MB"] = step * 0.5
        out.append((step, values))
    return out


def _table_rows(job: str) -> dict[int, dict[int, dict[str, float]]]:
    rows: dict[int, dict[int, dict[str, float]]] = {}
    for row in read_rank_table(job).to_pylist():
        rank, step = row.pop("rank"), row.pop("step")
        row.pop("wall_time")
        assert step not in rows.setdefault(rank, {}), "a record twice"
        rows[rank][step] = {k: v for k, v in row.items() if v is not None}
    return rows


@pytest.mark.parametrize("receiver_first", [True, False], ids=["receiver-up", "receiver-late"])
def test_every_record_of_every_peer_reaches_the_table_in_few_datagrams(tmp_path, monkeypatch, receiver_first):
    sent: list[int] = []
    real_drain = NodeChannel._drain_pending

    def counting(self):
        sent.append(len(self._pending))
        return real_drain(self)

    monkeypatch.setattr(NodeChannel, "_drain_pending", counting)
    job, n = str(tmp_path / "job"), 3000
    receiver = NodeChannel(job, rank=0, local_rank=0, local_world=3, instance=99) if receiver_first else None
    peers = [NodeChannel(job, rank=r, local_rank=r, local_world=3, instance=99) for r in (1, 2)]
    for peer in peers:
        for step, values in _records(peer.rank, n):
            peer.send(step, values)
    if receiver is None:  # the peers kept what they could not send yet, and send it now
        assert all(peer._pending for peer in peers)
        receiver = NodeChannel(job, rank=0, local_rank=0, local_world=3, instance=99)
    receiver.send(0, {"Memory/RAM/process_rss_GB": 0.5})
    for peer in peers:
        peer.close(wait_s=30)
    receiver.close(wait_s=30)
    assert [peer.dropped for peer in peers] == [0, 0]
    rows = _table_rows(job)
    assert sorted(rows) == [0, 1, 2]
    for rank in (1, 2):
        assert rows[rank] == dict(_records(rank, n))
    assert len(sent) < 2 * n / 20, "a datagram per record, or close to it"


def test_a_malformed_datagram_is_reported_once_and_the_rest_still_arrives(tmp_path, caplog):
    import socket

    job = str(tmp_path / "job")
    receiver = NodeChannel(job, rank=0, local_rank=0, local_world=2, instance=98)
    peer = NodeChannel(job, rank=1, local_rank=1, local_world=2, instance=98)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.sendto(receiver._token + channel._FRAME.pack(10) + b"too short", receiver._address)
    for step, values in _records(1, 10):
        peer.send(step, values)
    peer.close(wait_s=30)
    receiver.close(wait_s=30)
    assert _table_rows(job)[1] == dict(_records(1, 10))
    said = [r.getMessage().split(" (")[0] for r in caplog.records]
    assert said == ["tbmem: a record for the rank table could not be read"]


def test_private_runs_of_ranks_that_died_before_close_are_swept_by_the_next_job(tmp_path, monkeypatch):
    import os
    import subprocess
    import sys
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    namespace = compact._pid_namespace()
    names = {"dead": f"tbmem-rank3-{namespace}-{dead}-abc", "alive": f"tbmem-rank4-{namespace}-{os.getpid()}-abc",
             "other_namespace": f"tbmem-rank5-1{namespace}-{dead}-abc", "not_ours": "tbmem-rank6-abc"}
    for name in names.values():
        (tmp_path / name).mkdir()
        (tmp_path / name / "events.out.tfevents.1").write_bytes(b"x")
    made = compact.staging_folder(7)
    assert os.path.basename(made).startswith(f"tbmem-rank7-{namespace}-{os.getpid()}-")
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([os.path.basename(made), names["alive"], names["other_namespace"], names["not_ours"]])


@pytest.mark.parametrize("rate, many", [(1e12, True), (1.0, False)], ids=["small-file", "large-file"])
def test_the_table_is_rewritten_less_often_as_it_grows(tmp_path, monkeypatch, rate, many):
    import time

    monkeypatch.setattr(channel, "_FLUSH_S", 0.05)
    monkeypatch.setattr(channel, "_REWRITE_BYTES_PER_S", rate)  # 1 byte/s: a table of kilobytes waits hours
    monkeypatch.setattr(channel, "_BATCH_S", 0.0)
    job = str(tmp_path / "job")
    receiver = NodeChannel(job, rank=0, local_rank=0, local_world=2, instance=97)
    peer = NodeChannel(job, rank=1, local_rank=1, local_world=2, instance=97)
    for step, values in _records(1, 40):
        peer.send(step, values)
        time.sleep(0.03)
    groups = receiver._table.row_groups
    peer.close(wait_s=30)
    receiver.close(wait_s=30)
    assert groups > 3 if many else groups == 1
    assert _table_rows(job)[1] == dict(_records(1, 40))


def test_records_before_a_pause_reach_the_table_without_a_next_record(tmp_path, monkeypatch):
    import time

    monkeypatch.setattr(channel, "_FLUSH_S", 0.05)
    job = str(tmp_path / "job")
    receiver = NodeChannel(job, rank=0, local_rank=0, local_world=2, instance=96)
    peer = NodeChannel(job, rank=1, local_rank=1, local_world=2, instance=96)
    try:
        for step, values in _records(1, 5):  # a burst, then an evaluation of minutes: no record follows
            peer.send(step, values)
        deadline = time.monotonic() + 20
        while receiver._table.rows < 5 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert receiver._table.rows == 5  # in the file, peer still open
    finally:
        peer.close(wait_s=30)
        receiver.close(wait_s=30)
    assert _table_rows(job)[1] == dict(_records(1, 5))
