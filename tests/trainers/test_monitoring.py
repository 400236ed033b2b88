"""TrainerMonitoring's per-step hooks: snapshot markers made only while a recorder records."""

from __future__ import annotations

import pytest
import torch

from tbmem import MemoryWriterConfig
from tbmem.snapshot import SnapshotConfig, load_snapshot
from tbmem.snapshot.store import PLUGIN_DIR
from trainers.monitoring import TrainerMonitoring

STEP = [("step", "step {}"), ("phase", "forward"), ("phase", "backward"), ("phase", "optimizer")]


def _marks(first: int, last: int) -> list[tuple[str, str]]:
    return [(kind, label.format(s)) for s in range(first, last + 1) for kind, label in STEP]


@pytest.mark.parametrize("census_at, expected", [
    # the record (where a window opens and closes) comes after the optimizer: whole steps
    ("after_backward", {0: _marks(0, 1), 4: _marks(4, 5)}),
    # the record comes before backward: a window opens and closes between forward and backward
    ("before_backward", {0: _marks(0, 1)[:-2], 4: _marks(3, 5)[2:-2]}),
])
def test_snapshot_windows_hold_every_mark_the_hooks_made_while_recording(tmp_path, census_at, expected):
    import tbmem.snapshot.markers as markers

    markers._explicit_steps = False  # earlier tests in this process may have marked their own steps
    cfg = MemoryWriterConfig(every=1, census_every=0,
                             snapshot=SnapshotConfig(every=4, window=2, html=False, pickle=False))
    mon = TrainerMonitoring.create(tmp_path, enabled=True, verbose_batches=0, tbmem_config=cfg,
                                   census_at=census_at)
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        for step in range(8):
            mon.on_batch_start(step)
            with mon.step(step):
                loss = model(torch.randn(4, 8)).pow(2).sum()
                mon.before_backward(step, loss)
                loss.backward()
                mon.before_optimizer(step)
                opt.step()
                mon.before_zero_grad(step, loss)
                opt.zero_grad()
            mon.on_batch_end(step, loss.item())
        mon.close()
        found = {}
        for path in sorted((tmp_path / PLUGIN_DIR).glob("snapshot_*.json.gz")):
            step = int(path.name.split("step")[1].split(".")[0])
            found[step] = [(m["kind"], m["label"]) for m in load_snapshot(path).main.markers]
        # no automatic "after step N" marks either: the trainer marks its own steps
        assert found == expected
    finally:
        markers._explicit_steps = False
