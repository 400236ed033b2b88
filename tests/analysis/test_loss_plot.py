"""The notebook's loss-and-memory chart: per-step and per-epoch series never share an x axis, and a
series sampled sparsely is drawn through all its samples."""

from __future__ import annotations

import math

import pytest

from tbmem.analysis import load_scalars, plot_loss_and_memory
from tbmem._internal.tags import TAGS
from tests.analysis._logdirs import write_run

pytest.importorskip("matplotlib")

RSS = TAGS["ram_rss"].tag


def _values(step: int) -> dict[str, float]:
    values = {"Loss/aux": 1.0 / (step + 1)}  # every step
    if step % 5 == 0:
        values["Loss/batch"] = 2.0 / (step + 1)  # every 5th step: sparse next to Loss/aux
    if step % 10 == 0:
        values[RSS] = 0.5 + (0.25 if step >= 30 else 0.0)  # a jump at step 30
    return values


@pytest.fixture
def run_dir(tmp_path):
    write_run(tmp_path / "r", range(40), _values)
    write_run(tmp_path / "r", range(4), lambda e: {"Loss/train": 1.0 - e / 10, "Loss/val": 1.1 - e / 10})
    return tmp_path


def _series(ax):
    return [line for line in ax.get_lines() if not line.get_label().startswith("_")]


def test_epoch_series_get_their_own_axis(run_dir):
    fig, _ = plot_loss_and_memory(load_scalars(run_dir), "r")
    per_step, memory, per_epoch = fig.axes
    assert [ax.get_xlabel() for ax in fig.axes] == ["step", "step", "epoch"]
    assert sorted(line.get_label() for line in _series(per_step)) == ["aux", "batch"]
    assert sorted(line.get_label() for line in per_epoch.get_lines()) == ["train", "val"]
    for line in per_epoch.get_lines():
        assert list(line.get_xdata()) == [0, 1, 2, 3]  # epochs, not steps 0..3 of the step axis
    assert per_epoch.get_xlim()[1] < 5 and per_step.get_xlim()[1] > 35


def test_sparse_series_keep_every_sample(run_dir):
    fig, marks = plot_loss_and_memory(load_scalars(run_dir), "r")
    per_step, memory, _ = fig.axes
    batch = next(line for line in _series(per_step) if line.get_label() == "batch")
    assert list(batch.get_xdata()) == list(range(0, 40, 5))  # 8 samples, none lost to gaps
    assert not any(math.isnan(y) for y in batch.get_ydata())
    assert batch.get_marker() == "o"  # sparse: each sample marked
    (rss,) = _series(memory)
    assert list(rss.get_xdata()) == [0, 10, 20, 30]
    assert marks == [30]  # the jump, marked on both step panels
    assert 30 in [line.get_xdata()[0] for line in per_step.get_lines() if line.get_linestyle() == ":"]


def test_a_single_record_gives_a_visible_point(tmp_path):
    write_run(tmp_path / "one", [3], lambda s: {"Loss/evaluation": 0.5, RSS: 0.4})
    fig, marks = plot_loss_and_memory(load_scalars(tmp_path), "one")
    assert marks == [] and len(fig.axes) == 2
    for ax in fig.axes:
        assert ax.get_xlim() == (2.0, 4.0)
        (line,) = _series(ax)
        assert line.get_marker() == "o" and list(line.get_xdata()) == [3]
