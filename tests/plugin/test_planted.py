"""A shared logdir with things planted in it, served by a real tensorboard on 127.0.0.1.

Symlinks where the Memory tab reads census lines, a snapshot swapped for a symlink while it is
served, a census file without a line end, snapshots that are expensive to convert. The server's
own memory is read from /proc; its conversion processes are watched as its children.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from tbmem import MemoryWriter
from tbmem._internal.snapshot.schema import SnapshotBuilder, encode_json_gz
from tests.plugin._logdir import Server, get, get_json

SECRET = "OUTSIDE-SECRET-7f3a"


def _snapshot(frame: str) -> bytes:
    b = SnapshotBuilder(source="dispatch", device="cpu")
    for i in range(20):
        b.alloc(4096 * (i + 1), time_us=i, stack=[("/home/u/train.py", 10, frame)])
    return encode_json_gz(b.build(kind="snapshot", step=1))


def _run(run: Path, steps: int = 4) -> None:
    model = torch.nn.Linear(8, 8)
    with MemoryWriter(run, every=1, census_every=1, custom_layout=False) as w:
        w.watch(model)
        for step in range(steps):
            w.log_memory(step)


def _events(n: int, own_frames: bool) -> list[dict]:
    """n allocator events in torch's format; ``own_frames``: each event carries its own frame dicts
    (nothing for the pickler to share), as a hostile or unusual file may."""
    shared = [{"filename": f"/home/u/mod{i % 7}.py", "line": i, "name": f"fn{i % 13}"} for i in range(6)]
    out = []
    for i in range(n):
        frames = [dict(f) for f in shared] if own_frames else shared
        out.append({"action": "alloc" if i % 2 == 0 else "free_completed", "addr": 4096 * (i // 2),
                    "size": 512, "stream": 0, "time_us": 1_700_000_000_000_000 + i, "frames": frames})
    return out


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    root = tmp_path_factory.mktemp("planted")
    logs, outside = root / "logs", root / "outside"
    outside.mkdir()
    (outside / "census.jsonl").write_text(json.dumps({"step": 1, "total_bytes": 5, "secret": SECRET}) + "\n")
    (outside / "plugdir").mkdir()
    (outside / "plugdir" / "census.jsonl").write_text(json.dumps({"step": 1, "secret": SECRET}) + "\n")
    (outside / "secret.json.gz").write_bytes(_snapshot(SECRET))
    for run in ("linked_file", "linked_dir", "extra_keys", "huge", "race", "costly", "shared"):
        _run(logs / run)
    side = logs / "linked_file" / "plugins" / "tbmem" / "census.jsonl"
    side.unlink()
    side.symlink_to(outside / "census.jsonl")
    plugdir = logs / "linked_dir" / "plugins" / "tbmem"
    for f in plugdir.iterdir():
        f.unlink()
    plugdir.rmdir()
    plugdir.symlink_to(outside / "plugdir")
    with open(logs / "extra_keys" / "plugins" / "tbmem" / "census.jsonl", "a") as fh:
        fh.write(json.dumps({"step": 2, "total_bytes": 64, "secret": SECRET, "top": []}) + "\n")
    with open(logs / "huge" / "plugins" / "tbmem" / "census.jsonl", "ab") as fh:
        fh.truncate(fh.tell() + 2**30)  # 1 GiB without a line end (sparse: no disk used)
    (logs / "race" / "plugins" / "tbmem" / "snapshot_rank0_step000000001.json.gz").write_bytes(_snapshot("inside"))
    with open(logs / "costly" / "costly_step3.pickle", "wb") as fh:  # 26 MiB, 200,000 events
        pickle.dump({"segments": [], "device_traces": [_events(200_000, own_frames=True)]}, fh, protocol=4)
    with open(logs / "shared" / "shared_step3.pickle", "wb") as fh:  # about 9 MiB, 200,000 events
        pickle.dump({"segments": [], "device_traces": [_events(200_000, own_frames=False)]}, fh, protocol=4)
    srv = Server(root, "--logdir", str(logs), "--load_fast", "false",
                 wait_run="shared")
    yield {"root": root, "logs": logs, "outside": outside, "server": srv,
           "url": f"{srv.base}/data/plugin/tbmem"}
    srv.stop()


def _status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak) of a process, in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


def _reset_peak(pid: int) -> None:
    """Start VmHWM afresh at the current RSS (Linux: writing 5 to clear_refs)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def test_a_symlinked_census_file_or_folder_is_not_served(planted):
    # plugins/tbmem/census.jsonl (or the folder) linked out of the logdir: every key of each line was served
    for run in ("linked_file", "linked_dir"):
        status, body, _ = get(f"{planted['url']}/at?run={run}&step=1")
        assert status == 200
        assert SECRET.encode() not in body
        census = json.loads(body)["census"]
        assert census is None or census.get("source") != "census.jsonl"


def test_only_the_fields_of_a_census_line_are_served(planted):
    census = get_json(f"{planted['url']}/at?run=extra_keys&step=2")["census"]
    assert census["source"] == "census.jsonl" and census["step"] == 2 and census["total_bytes"] == 64
    assert "secret" not in census


def test_a_census_file_without_a_line_end_costs_bounded_memory(planted):
    # 1 GiB with no complete line was read whole at every request: the server's memory grew by 1 GiB
    pid = planted["server"].proc.pid
    get_json(f"{planted['url']}/at?run=extra_keys&step=1")  # warm: the route's own imports and caches
    _reset_peak(pid)
    before = _status(pid)["VmRSS"]
    for _ in range(6):
        doc = get_json(f"{planted['url']}/at?run=huge&step=2")
        assert doc["census"] is not None  # from the event file's scalars; the side file's lines are lost
    grown = _status(pid)["VmHWM"] - before
    assert grown < 64 * 2**20, f"the server's peak memory grew by {grown / 2**20:.0f} MiB"


def test_a_snapshot_swapped_for_a_symlink_is_never_served(planted):
    # the file was checked when listed and opened again later, following a symlink swapped in meanwhile
    folder = planted["logs"] / "race" / "plugins" / "tbmem"
    target = folder / "snapshot_rank0_step000000001.json.gz"
    keep = planted["root"] / "race-original.json.gz"
    os.link(target, keep)
    sid = next(s["id"] for s in get_json(f"{planted['url']}/snapshots?run=race"))
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            os.symlink(planted["outside"] / "secret.json.gz", folder / ".swap-link")
            os.replace(folder / ".swap-link", target)
            time.sleep(0.001)
            os.link(keep, folder / ".swap-file")
            os.replace(folder / ".swap-file", target)
            time.sleep(0.001)

    swapper = threading.Thread(target=swap)
    swapper.start()
    statuses, odd = [], []
    try:
        for _ in range(400):
            status, body, _ = get(f"{planted['url']}/snapshot?run=race&id={sid}")
            statuses.append(status)
            if status not in (200, 404):
                odd.append(body[:400])
            assert SECRET.encode() not in body
    finally:
        stop.set()
        swapper.join()
    assert set(statuses) <= {200, 404} and 200 in statuses, (statuses, odd)


def _children(pid: int) -> set[int]:
    """Child processes of every thread of ``pid`` (a request thread starts a conversion)."""
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out.update(int(p) for p in (task / "children").read_text().split())
        except OSError:
            pass
    return out


def _conversions(pid: int) -> set[int]:
    """The children of ``pid`` that are tbmem's snapshot conversions (other plugins, torch-tb-profiler's
    loaders among them, start processes of their own)."""
    out: set[int] = set()
    for child in _children(pid):
        try:
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"tbmem._internal.plugin.convert" in argv:
            out.add(child)
    return out


def _watch_children(pid: int, stop: threading.Event, seen: list[set[int]]) -> None:
    while not stop.is_set():
        seen.append(_conversions(pid))
        time.sleep(0.02)


def test_four_first_opens_at_once_share_one_conversion_outside_the_server(planted):
    # four concurrent first opens converted the file four times, inside the server (4x the memory)
    pid = planted["server"].proc.pid
    sid = get_json(f"{planted['url']}/snapshots?run=shared")[0]["id"]
    _reset_peak(pid)
    before = _status(pid)["VmRSS"]
    stop, seen = threading.Event(), []
    watcher = threading.Thread(target=_watch_children, args=(pid, stop, seen))
    watcher.start()
    try:
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda _: get(f"{planted['url']}/snapshot?run=shared&id={sid}"), range(4)))
        again = get(f"{planted['url']}/snapshot?run=shared&id={sid}")  # kept: no conversion
    finally:
        stop.set()
        watcher.join()
    assert [a[0] for a in answers + [again]] == [200] * 5
    assert len({a[1] for a in answers + [again]}) == 1  # the same page
    assert answers[0][1].startswith(b"<!DOCTYPE html>")
    grown = _status(pid)["VmHWM"] - before
    assert grown < 64 * 2**20, f"the server's peak memory grew by {grown / 2**20:.0f} MiB"
    conversions = set().union(*seen)
    assert len(conversions) == 1, f"{len(conversions)} conversion processes"


def test_a_snapshot_over_the_memory_limit_is_refused_without_the_server_growing(planted):
    # 26 MiB of events with their own frame dicts needs 636 MiB to convert, over the 465 MiB the tab allows a
    # file of that size (256 MiB + 8 per byte); the server's memory never held any of it
    pid = planted["server"].proc.pid
    sid = get_json(f"{planted['url']}/snapshots?run=costly")[0]["id"]
    _reset_peak(pid)
    before = _status(pid)["VmRSS"]
    status, body, headers = get(f"{planted['url']}/snapshot?run=costly&id={sid}")
    assert status == 413, body[:300]
    assert headers["Content-Type"].startswith("application/json")
    message = json.loads(body)["error"]
    assert message == ("costly_step3.pickle needs more than the 465 MiB of memory the Memory tab allows one "
                       "snapshot; open it with `tbmem snapshot html`, which has no such limit")
    grown = _status(pid)["VmHWM"] - before
    assert grown < 64 * 2**20, f"the server's peak memory grew by {grown / 2**20:.0f} MiB"
    t = time.monotonic()
    assert get(f"{planted['url']}/snapshot?run=costly&id={sid}")[0] == 413  # the answer is kept
    assert time.monotonic() - t < 5


def test_malformed_snapshots_are_422(planted):
    # valid gzip and JSON, wrong types: HTTP 500
    folder = planted["logs"] / "race" / "plugins" / "tbmem"
    doc = json.loads(gzip.decompress(_snapshot("inside")))
    bad = {"categories": 1.5}, {"meta": {"library_roots": [5]}}, {"devices": {"a": 1}}
    for step, change in enumerate(bad, start=10):
        (folder / f"snapshot_rank0_step{step:09d}.json.gz").write_bytes(
            gzip.compress(json.dumps(dict(doc, **change)).encode()))
    snaps = {s["step"]: s["id"] for s in get_json(f"{planted['url']}/snapshots?run=race")}
    for step in (10, 11, 12):
        status, body, _ = get(f"{planted['url']}/snapshot?run=race&id={snaps[step]}")
        assert status == 422, (step, status, body[:300])
        assert "is not a readable memory snapshot" in json.loads(body)["error"]
