"""The census leaves nothing behind (issue 26, item 1): no storage objects, no index that grows with the heap.

Measuring a storage through ``untyped_storage()`` makes a Python object that torch keeps as long as the
storage; the incremental scan kept a weak reference per tensor and per storage. Over 100k small tensors
that was 300k more gc-tracked objects, ~70 MB of RSS and a user's ``gc.collect()`` twice as slow.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tbmem._internal.census import take_census

ROOT = Path(__file__).resolve().parents[2]


def _storage_objects() -> int:
    return sum(1 for o in gc.get_objects() if type(o) is torch.UntypedStorage)


def test_measuring_tensors_makes_no_storage_objects() -> None:
    gc.collect()
    keep = [torch.zeros(n) for n in range(1, 500)] + [torch.nn.Parameter(torch.ones(77))]
    before = _storage_objects()
    census = take_census()
    census = take_census(full_scan=True)
    gc.collect()
    assert _storage_objects() == before
    expected = sum(t.numel() * 4 for t in keep)  # each its own storage
    assert census.by_category["parameters"] + census.by_category["other"] >= expected


class _Wrapper(torch.Tensor):
    """A wrapper subclass: its storage is a placeholder without data; ``elem`` holds the memory."""

    @staticmethod
    def __new__(cls, elem: torch.Tensor) -> "_Wrapper":
        return torch.Tensor._make_wrapper_subclass(cls, elem.shape, dtype=elem.dtype, device=elem.device)

    def __init__(self, elem: torch.Tensor) -> None:
        self.elem = elem

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206
        raise NotImplementedError(func)


def test_a_wrapper_subclass_leaves_no_placeholder_storage_behind(tbmem_log) -> None:
    """Measuring a wrapper made its placeholder storage object, and every later census then noted
    'a UntypedStorage could not be measured'."""
    gc.collect()
    wrapped = _Wrapper(torch.zeros(321))
    before = _storage_objects()
    first, second = take_census(), take_census(full_scan=True)
    assert _storage_objects() == before
    assert first.notes == [] and second.notes == []
    assert not [r for r in tbmem_log.records if "could not be measured" in r.getMessage()]
    assert [r.bytes for r in second.records if r.name == "wrapped"] == [wrapped.elem.numel() * 4]


_TEN_CENSUSES = textwrap.dedent("""
    import gc, json, sys
    import torch
    from tbmem._internal.census import take_census

    def rss_kb():
        fields = dict(line.split(":", 1) for line in open("/proc/self/status") if line.startswith("Rss"))
        return {k: int(v.split()[0]) for k, v in fields.items()}

    warm = [torch.zeros(1) for _ in range(25_000)]  # the first census of a process pages in its code (numpy's
    take_census()  # sorts of large arrays among it) and builds its caches: on a quarter of the tensors, freed after
    del warm
    tiny = [torch.zeros(1) for _ in range(100_000)]
    gc.collect()
    rss = rss_kb()  # first: gc.get_objects()'s list (2 MB) is memory the C heap may keep
    objects = len(gc.get_objects())
    scans = []
    for _ in range(10):
        census = take_census()
        scans.append((census.heap_scan, census.by_category["other"]))
        del census
    gc.collect()
    anon = rss_kb()["RssAnon"]
    total = rss_kb()["RssAnon"] + rss_kb()["RssFile"]
    print(json.dumps({"objects": [objects, len(gc.get_objects())], "anon": [rss["RssAnon"], anon],
                      "total": [rss["RssAnon"] + rss["RssFile"], total],
                      "scans": scans, "expected": sum(t.numel() * 4 for t in tiny)}))
""")


def test_ten_censuses_over_100k_tensors_leave_objects_and_memory_as_they_were(tmp_path) -> None:
    """gc-tracked objects, private and total resident memory after ten censuses within 1% of before (a fresh
    process)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", _TEN_CENSUSES], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    (before, after), (anon_before, anon_after) = got["objects"], got["anon"]
    assert abs(after - before) <= before // 100, got["objects"]
    assert abs(anon_after - anon_before) <= anon_before // 100, got["anon"]
    assert abs(got["total"][1] - got["total"][0]) <= got["total"][0] // 100, got["total"]
    assert all(other >= got["expected"] for _, other in got["scans"])  # every census counted all of them


_FIRST_CENSUS_IN = textwrap.dedent("""
    import contextlib, gc, sys
    import torch
    from tbmem._internal.census import take_census

    def storage_objects():
        return sum(1 for o in gc.get_objects() if type(o) is torch.UntypedStorage)

    keep = [torch.zeros(n) for n in range(1, 200)]
    gc.collect()
    before = storage_objects()
    with {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}[sys.argv[1]]():
        take_census()  # the process's first census, in an evaluation loop
    take_census(full_scan=True)
    gc.collect()
    print(storage_objects() - before)
""")


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_a_first_census_under_no_grad_still_makes_no_storage_objects_after(mode: str, tmp_path) -> None:
    """The first census of a process checks where torch keeps a tensor's storage on tensors it makes, some
    of them requiring grad: under ``torch.no_grad()`` those had no autograd metadata, the check failed, and
    every later census of the process made a storage object per tensor (a fresh process: the check is once)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", _FIRST_CENSUS_IN, mode], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "0"
