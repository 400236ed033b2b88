"""tbmem._internal.logdir.fs.RemoteMirror: what reaches the store, and how often a growing file is sent again.

fsspec's in-memory file system stands in for the store here (tests/remote/test_s3.py runs the same
writer against a real S3 server).
"""

from __future__ import annotations

import pytest

pytest.importorskip("fsspec", reason="remote logdirs need fsspec (tbmem[remote])")

from tbmem._internal.logdir import fs as remote  # noqa: E402


@pytest.fixture
def store():
    import fsspec

    memory = fsspec.filesystem("memory")
    yield memory
    if memory.exists("/mirror-test"):
        memory.rm("/mirror-test", recursive=True)


@pytest.mark.parametrize("rate, again", [(1e12, True), (1.0, False)], ids=["small-file", "large-file"])
def test_a_grown_file_is_sent_again_after_its_size_over_the_rate_and_always_at_close(tmp_path, store, monkeypatch,
                                                                                     rate, again):
    monkeypatch.setattr(remote, "REUPLOAD_BYTES_PER_S", rate)
    events = tmp_path / "events.out.tfevents.1"
    events.write_bytes(b"a" * 1000)
    mirror = remote.RemoteMirror("memory://mirror-test/run", str(tmp_path), every_s=0)
    assert mirror.sync() and mirror.uploads == 1
    with open(events, "ab") as f:
        f.write(b"b" * 1000)
    (tmp_path / "census.jsonl").write_text("{}\n")  # a new file goes at once, whatever the rate
    assert mirror.sync()
    assert store.cat("/mirror-test/run/census.jsonl") == b"{}\n"
    expected = events.read_bytes() if again else b"a" * 1000
    assert store.cat("/mirror-test/run/events.out.tfevents.1") == expected
    assert mirror.uploads == (3 if again else 2)
    assert mirror.close()
    assert store.cat("/mirror-test/run/events.out.tfevents.1") == events.read_bytes()
