"""Process-tree RSS: DataLoader workers' memory, invisible in the training process's RSS, is seen."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from tbmem import MemoryWriter
from tbmem._internal.probes import process_tree
from tbmem._internal.probes.process_tree import ProcessTreeProbe, descendants, tree_rss
from tbmem._internal.tags import TAGS
from tests._events import scalars

_HELD: list[bytearray] = []


class _Numbers(Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor(i)


def _hold(mb: int):  # noqa: ANN202
    def init(_worker_id: int) -> None:
        if mb:
            block = bytearray(mb * 2**20)
            for i in range(0, len(block), 4096):  # resident, not only reserved
                block[i] = 1
            _HELD.append(block)
    return init


def _workers_rss_mb(tmp_path, extra_mb: int) -> tuple[float, float]:
    """(tree RSS - process RSS in MB, worker count) logged with 2 workers each holding extra_mb more."""
    loader = DataLoader(_Numbers(), batch_size=8, num_workers=2, persistent_workers=True,
                        worker_init_fn=_hold(extra_mb))
    run = tmp_path / f"extra{extra_mb}"
    with MemoryWriter(run, every=1, census_every=0, custom_layout=False) as writer:
        it = iter(loader)
        for step in range(4):  # both workers have started (and run their init) after a few batches
            next(it)
            writer.log_memory(step)
        del it
    del loader
    tree = dict(scalars(run, TAGS["ram_tree_rss"].tag))
    rss = dict(scalars(run, TAGS["ram_rss"].tag))
    workers = dict(scalars(run, TAGS["ram_tree_workers"].tag))
    return (tree[3] - rss[3]) * 1024, workers[3]


def _measure_in_a_fresh_process(tmp_path) -> list[float]:
    # A fresh process: children that other tests of this process left running (a TensorBoard
    # server shutting down, a torchrun job) would be descendants too, with RSS of their own.
    code = ("import json, pathlib, sys; from tests.probes.test_process_tree import _workers_rss_mb; "
            "t = pathlib.Path(sys.argv[1]); print(json.dumps([*_workers_rss_mb(t, 0), *_workers_rss_mb(t, 50)]))")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                         timeout=300, cwd=root, env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_dataloader_workers_holding_50_mb_each_show_in_the_tree_rss(tmp_path):
    base, base_workers, held, held_workers = _measure_in_a_fresh_process(tmp_path)
    assert base_workers == held_workers == 2
    print(f"workers' RSS: {base:.1f} MB without, {held:.1f} MB with 2 x 50 MB")
    assert 90 <= held - base <= 115, (base, held)  # 2 x 50 MB more, and nothing in the main process


def test_the_tree_is_this_process_plus_its_descendants():
    with subprocess.Popen([sys.executable, "-c", "import time; b = bytearray(30 * 2**20); "
                           "[b.__setitem__(i, 1) for i in range(0, len(b), 4096)]; print('ready', flush=True); "
                           "time.sleep(60)"], stdout=subprocess.PIPE, text=True) as child:
        _check_child(child)
    assert child.pid not in descendants()


def _check_child(child: subprocess.Popen) -> None:
    try:
        assert child.stdout.readline().strip() == "ready"
        assert child.pid in descendants()
        total, count = tree_rss()
        assert count >= 1
        with open(f"/proc/{child.pid}/statm") as fh:
            child_rss = int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        assert child_rss > 30 * 2**20
        alone, _ = tree_rss(child.pid)
        assert alone == pytest.approx(child_rss, rel=0.05)
        assert total >= child_rss
    finally:
        child.kill()
        child.wait()


def test_psutil_fallback_finds_the_same_children(monkeypatch):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        fast = set(descendants())
        monkeypatch.setattr(process_tree, "_children_proc", lambda pid: None)
        assert set(descendants()) == fast and child.pid in fast
    finally:
        child.kill()
        child.wait()


def test_probe_reads_bytes_and_a_count():
    readings = ProcessTreeProbe().read()
    assert readings["ram_tree_workers"] >= 0
    with open("/proc/self/statm") as fh:
        own = int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    assert readings["ram_tree_rss"] >= own * 0.9
