"""Without the C runs, a pickle of a logdir (the Memory tab's) is never handed to an Unpickler.

The brief's rule: never unpickle a file the user did not explicitly ask to load. The CLI's files are
named by the user (the restricted Unpickler is the fast fallback there); the tab's are not.
"""

from __future__ import annotations

import io
import pickle

import pytest

from tbmem._internal.snapshot import readers


def _pickle() -> bytes:
    ev = {"action": "alloc", "addr": 64, "size": 512, "stream": 0, "time_us": 1_700_000_000_000_000,
          "frames": [{"filename": "/home/u/train.py", "line": 3, "name": "step"}]}
    free = dict(ev, action="free_completed", time_us=ev["time_us"] + 5)
    return pickle.dumps({"segments": [], "device_traces": [[ev, free]]}, protocol=4)


def test_the_tabs_reading_never_unpickles_without_the_c_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    def unpickled(*args: object, **kwargs: object) -> None:
        raise AssertionError("the tab's file reached an Unpickler")

    fast = readers.read_snapshot(io.BytesIO(_pickle()), "s.pickle", unpickle=False)
    monkeypatch.setattr(readers, "C_READER", False)
    monkeypatch.setattr(readers, "_unpickled", unpickled)
    snap = readers.read_snapshot(io.BytesIO(_pickle()), "s.pickle", unpickle=False)
    with pytest.raises(AssertionError, match="Unpickler"):
        readers.read_snapshot(io.BytesIO(_pickle()), "s.pickle")  # the CLI's: the restricted Unpickler
    # the interpreter's snapshot is the C path's (where the C runs were built)
    assert [(d.name, d.time_us.tolist(), d.allocs["size"].tolist()) for d in snap.devices] == [
        (d.name, d.time_us.tolist(), d.allocs["size"].tolist()) for d in fast.devices] == [("cuda:0", [0, 5], [512])]
