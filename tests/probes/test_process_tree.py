"""Process-tree RSS: DataLoader workers' memory, invisible in the training process's RSS, is seen."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from tbmem import MemoryWriter
from tbmem.probes import process_tree
from tbmem.probes.process_tree import ProcessTreeProbe, descendants, tree_rss
from tbmem.tags import TAGS
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
    """(tree RSS - process RSS in MB, new descendants) logged with 2 workers each holding extra_mb more.

    Children an earlier test of the same process left running are descendants too: they are
    counted before the loader starts and taken off, and their RSS cancels in the comparison.
    """
    already = len(psutil.Process().children(recursive=True))
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
    return (tree[3] - rss[3]) * 1024, workers[3] - already


def test_dataloader_workers_holding_50_mb_each_show_in_the_tree_rss(tmp_path):
    base, base_workers = _workers_rss_mb(tmp_path, 0)
    held, held_workers = _workers_rss_mb(tmp_path, 50)
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
