"""The snapshot pickle reader runs no code from the file and imports no torch."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import pytest

from tbmem._internal.snapshot.readers import load_snapshot, load_torch_pickle
from tbmem._internal.snapshot.safe_pickle import UnsafePickleError, load_plain
from tests._shared import real_pickles



class _Planted:
    """Unpickling this would create a file (os.system is the classic payload)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def test_planted_reduce_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "was-run"
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [[_Planted(str(marker))]]}))
    with pytest.raises(UnsafePickleError, match="posix.mkdir|os.mkdir"):
        load_torch_pickle(path)
    with pytest.raises(pickle.UnpicklingError):
        load_snapshot(path)
    assert not marker.exists()


def test_plain_snapshot_dict_round_trips(tmp_path):
    d = {"segments": [{"device": 0, "total_size": 2, "blocks": [], "address": 1}],
         "device_traces": [[{"action": "alloc", "addr": 1, "size": 2, "frames": [], "time_us": 1}]]}
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(d, protocol=4))
    assert load_plain(path) == d
    assert load_snapshot(path).n_events == 1


def test_allow_pickle_false_still_refuses(tmp_path):
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps({"segments": []}))
    with pytest.raises(ValueError, match="not allowed"):
        load_snapshot(path, allow_pickle=False)


def test_real_snapshots_are_plain_data():
    paths = real_pickles()
    assert len(paths) >= 4
    for path in paths:
        data = load_torch_pickle(path)
        assert "segments" in data


def test_reading_snapshots_does_not_import_torch():
    code = ("import sys, tbmem._internal.snapshot.readers, tbmem._internal.snapshot.viewer, tbmem._internal.snapshot.cuda; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
