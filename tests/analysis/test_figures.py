"""The notebook's figures: no empty VRAM panel for a CPU run, every line of the large-tensor chart named."""

from __future__ import annotations

import pytest

from tbmem.analysis import load_scalars
from tbmem._internal.analysis.figures import plot_large_tensors, plot_readings
from tbmem._internal.tags import TAGS
from tests.analysis._logdirs import write_run

pytest.importorskip("matplotlib")

RSS, PEAK = TAGS["ram_rss"].tag, TAGS["ram_peak_rss"].tag
VRAM = TAGS["vram_allocated"].tag


@pytest.fixture
def cpu_and_gpu(tmp_path):
    write_run(tmp_path / "cpu", range(0, 50, 10), lambda s: {RSS: 0.37, PEAK: 0.38})
    write_run(tmp_path / "gpu", range(0, 50, 10), lambda s: {RSS: 1.5, VRAM: 2.0 + s / 100})
    return load_scalars(tmp_path)


def test_a_cpu_run_gets_its_ram_panel_across_the_row_and_no_vram_axes(cpu_and_gpu):
    fig = plot_readings(cpu_and_gpu[cpu_and_gpu["run"] == "cpu"])
    (ax,) = fig.axes
    assert ax.get_title() == "cpu: RAM" and [line.get_label() for line in ax.get_lines()] == ["process RSS", "peak RSS"]
    assert ax.get_ylabel() == "MiB"  # 0.37 GiB in the unit that fits
    fig = plot_readings(cpu_and_gpu)
    assert [ax.get_title() for ax in fig.axes] == ["cpu: RAM", "gpu: VRAM", "gpu: RAM"]
    assert all(ax.get_lines() for ax in fig.axes)  # no empty panel
    cpu, vram, _ = fig.axes
    assert cpu.get_position().width > 1.8 * vram.get_position().width  # the CPU run's RAM spans the row


def test_large_tensors_name_both_lines(tmp_path):
    write_run(tmp_path / "run", range(0, 40, 10), lambda s: {TAGS["large_total"].tag: 0.01 * (1 + s // 10),
                                                             TAGS["large_count"].tag: 1 + s // 10})
    ax = plot_large_tensors(load_scalars(tmp_path), "run")
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["total (KiB, left)", "count (right)"]
    assert ax.get_ylabel() == "total (KiB)" and max(ax.get_lines()[0].get_ydata()) == pytest.approx(0.04 * 1024)


def test_the_process_tree_line_only_when_workers_make_it_differ(tmp_path):
    tree = TAGS["ram_tree_rss"].tag
    write_run(tmp_path / "alone", range(0, 30, 10), lambda s: {RSS: 0.37, tree: 0.37})
    write_run(tmp_path / "workers", range(0, 30, 10), lambda s: {RSS: 0.37, tree: 0.9})
    alone, workers = plot_readings(load_scalars(tmp_path)).axes
    assert [line.get_label() for line in alone.get_lines()] == ["process RSS"]
    assert [line.get_label() for line in workers.get_lines()] == ["process RSS", "process tree RSS"]
    assert alone.get_ylim()[0] == 0
