"""Allocator events paired in C (tbmem/_internal/snapshot/_pair.c) give exactly the pairs of the numpy pairing, on every
real snapshot's traces, a synthetic trace and random ones (reuse without frees, lone and pending frees)."""

from __future__ import annotations

import io

import numpy as np
import pytest

from tbmem._internal.snapshot import cuda_replay
from tbmem._internal.snapshot.cuda_replay import pair_allocations, pair_allocations_numpy
from tbmem._internal.snapshot.pickle_stream import read_pickle
from tests._extensions import not_built
from tests._shared import REAL, REAL2, real_pickles

_FIELDS = ("starts", "ends", "freereq", "pending", "lone_done", "lone_done_req", "lone_req")


def _require_c() -> None:
    if not cuda_replay.C_PAIRING:
        not_built("tbmem/_internal/snapshot/_creader.c was not built: the install found no C compiler")


def _same(act: np.ndarray, addr: np.ndarray) -> None:
    got, want = pair_allocations(act, addr), pair_allocations_numpy(act, addr)
    for name in _FIELDS:
        x, y = getattr(got, name), getattr(want, name)
        assert x.dtype == y.dtype and np.array_equal(x, y), name
    assert got.reused == want.reused


def _traces(data: bytes):
    top, rows = read_pickle(io.BytesIO(data))
    for trace in top.get("device_traces", []) if isinstance(top, dict) else []:
        idx = rows.rows_of(trace)
        yield rows.column("action")[idx], rows.column("addr")[idx]


def test_real_and_synthetic_traces_pair_the_same() -> None:
    _require_c()
    from benchmarks.bench_snapshot import write_torch_pickle

    buf = io.BytesIO()
    write_torch_pickle(buf, 60_000, empty_cache_every=20_000)
    n = 0
    for data in [p.read_bytes() for p in real_pickles(REAL) + real_pickles(REAL2)] + [buf.getvalue()]:
        for act, addr in _traces(data):
            _same(act, addr)
            n += act.shape[0]
    assert n > 140_000


@pytest.mark.parametrize("seed", range(6))
def test_random_traces_pair_the_same(seed: int) -> None:
    """Few addresses and every action code (0-9, and codes no action has): reuse without frees, lone
    frees with and without their request, requests never completed, all interleaved."""
    _require_c()
    rng = np.random.default_rng(seed)
    for _ in range(200):
        n = int(rng.integers(0, 400))
        act = rng.choice(np.array([0, 1, 1, 2, 3, 3, 4, 5, 9, -7], dtype=np.int8), n)
        addr = rng.integers(-3, int(rng.integers(1, 30)), n).astype(np.int64) * int(rng.choice([1, 512, 2**40]))
        _same(act, addr)
    big = rng.integers(0, 2**62, 5000).astype(np.int64)  # addresses that fit no 32-bit key
    _same(rng.integers(1, 4, 5000).astype(np.int8), big)


def test_bad_arguments_are_refused() -> None:
    _require_c()
    from tbmem._internal.snapshot import _creader

    act, addr = np.ones(4, dtype=np.int8), np.zeros(4, dtype=np.int64)
    outs = (np.empty(4, np.int64), np.empty(4, np.int64), np.empty(4, np.uint8), np.empty(0, np.int64),
            np.empty(0, np.int64), np.empty(0, np.int64))
    assert _creader.pair(act, addr, outs) == (0, 0, 3)
    with pytest.raises(ValueError):
        _creader.pair(act, addr[:3], outs)
    with pytest.raises(ValueError):
        _creader.pair(act, addr, outs[:5])
    with pytest.raises(ValueError, match="output array 1"):
        _creader.pair(act, addr, (outs[0], np.empty(3, np.int64), *outs[2:]))
