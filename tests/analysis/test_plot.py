"""report.png: the census and the process memory in separate panels, legends beside the plots,
units that fit, and a run with a single record drawn as something visible."""

from __future__ import annotations

import pytest

from tbmem.analysis import load_scalars, plot_timeline
from tbmem._internal.tags import TAGS
from tests.analysis._logdirs import CATEGORY, write_run

pytest.importorskip("matplotlib")

RSS = TAGS["ram_rss"].tag


def _overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


@pytest.fixture
def demo_like(tmp_path):
    """The demo's shape: 2 MB of census under an RSS of 0.37 GB."""
    write_run(tmp_path / "run", range(0, 150, 10), lambda s: {
        CATEGORY.format("parameters"): 0.0084, CATEGORY.format("activations"): 1.89,
        CATEGORY.format("other"): 0.08, RSS: 0.374})
    return tmp_path


def test_census_and_rss_never_share_an_axis(demo_like):
    fig = plot_timeline(load_scalars(demo_like))
    census_ax, lines_ax = fig.axes  # two panels, no twin axis
    assert census_ax.collections and not census_ax.get_lines()  # the stack only
    assert [line.get_label() for line in lines_ax.get_lines()] == ["RAM RSS"]
    assert not lines_ax.collections
    assert census_ax.get_ylabel() == "census (MiB)" and lines_ax.get_ylabel() == "process (MiB)"
    # the RSS line is drawn in MiB on its own axis: 0.374 GiB, not on top of a 2 MiB stack
    assert max(lines_ax.get_lines()[0].get_ydata()) == pytest.approx(0.374 * 1024, rel=1e-4)
    assert census_ax.get_ylim()[1] < 3


def test_legends_sit_beside_the_plots(demo_like):
    fig = plot_timeline(load_scalars(demo_like))
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    for ax in fig.axes:
        legend = ax.get_legend()
        assert legend is not None
        assert not _overlap(legend.get_window_extent(renderer), ax.get_window_extent(renderer))
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["other", "activations", "parameters"]  # top of the legend = top of the stack


def test_a_single_record_is_visible(tmp_path):
    write_run(tmp_path / "one", [7], lambda s: {CATEGORY.format("parameters"): 4.0,
                                               CATEGORY.format("activations"): 2.0, RSS: 0.4})
    fig = plot_timeline(load_scalars(tmp_path), path=tmp_path / "one.png")
    census_ax, lines_ax = fig.axes
    for ax in fig.axes:
        assert ax.get_xlim() == (6.0, 8.0)  # not matplotlib's -0.04..0.04
    heights = sorted(p.get_height() for p in census_ax.patches)
    assert heights == pytest.approx([2.0, 4.0])  # one stacked bar, in MiB
    (line,) = lines_ax.get_lines()
    assert line.get_marker() == "o" and list(line.get_xdata()) == [7]
    assert (tmp_path / "one.png").stat().st_size > 5_000


def test_a_run_without_census_gets_one_panel(tmp_path):
    write_run(tmp_path / "physical", range(6), lambda s: {RSS: 0.37})
    fig = plot_timeline(load_scalars(tmp_path))
    (ax,) = fig.axes
    assert ax.get_title().startswith("physical: process") and ax.get_ylim()[0] == 0


def test_plot_lines_and_stacked_center_a_single_step(tmp_path):
    from tbmem.analysis import plot_lines, plot_stacked

    write_run(tmp_path / "one", [5], lambda s: {CATEGORY.format("parameters"): 1.0, RSS: 0.4})
    df = load_scalars(tmp_path)
    assert plot_lines(df, "one", [("RSS", RSS)]).get_xlim() == (4.0, 6.0)
    assert plot_stacked(df, "one").get_xlim() == (4.0, 6.0)


def test_categories_have_the_memory_tabs_colours(demo_like):
    """One palette (tbmem._internal.palette): report.png's category colours are the Memory tab's."""
    from matplotlib.colors import to_hex

    from tbmem._internal.palette import CATEGORY_COLORS

    census_ax = plot_timeline(load_scalars(demo_like)).axes[0]
    handles, labels = census_ax.get_legend_handles_labels()
    drawn = {label: to_hex(h.get_facecolor()[0] if h.get_facecolor().ndim > 1 else h.get_facecolor(),
                           keep_alpha=False) for h, label in zip(handles, labels)}
    assert drawn == {c: CATEGORY_COLORS[c] for c in ("parameters", "activations", "other")}
