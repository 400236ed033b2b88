"""The custom-scalars layout: built from what the run writes, one unit per chart, one reading per line
colour, rewritten when a new kind of reading appears."""

from __future__ import annotations

import json
import re
import time

import pytest
import torch
from tensorboard.backend.event_processing import event_file_loader
from tensorboard.plugins.custom_scalar import layout_pb2

from tbmem import MemoryWriter
from tbmem._internal.layout import MAX_SEPARATE, LayoutTracker, custom_scalars_layout
from tbmem._internal.tags import TAGS
from tests.fake_cuda import install_fake_cuda

LAYOUT_TAG = "custom_scalars__config__"
UNIT = re.compile(r"\((GB|MB|ms|s|%|count|rank)\)$|\((GB|MB|ms|s|%|count|rank);")


def _reading_order(charts: dict) -> dict:
    """A section as written (tbmem._internal.layout.display_order: margin charts reversed) in reading order."""
    margins = [(t, c) for t, c in charts.items() if c[0] == "Margin"]
    return {**{t: c for t, c in charts.items() if c[0] != "Margin"}, **dict(reversed(margins))}


def layouts(logdir) -> list[dict[str, dict[str, tuple[str, list[str]]]]]:
    """Every layout written under ``logdir``, in order: category -> title -> (kind, regexes), each
    section in reading order."""
    out = []
    for path in sorted(logdir.glob("events.out.tfevents*")):
        for event in event_file_loader.EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                if value.tag == LAYOUT_TAG:
                    proto = layout_pb2.Layout()
                    proto.ParseFromString(value.tensor.string_val[0])
                    out.append({cat.title: _reading_order({
                        c.title: ("Margin", [s.value for s in c.margin.series] + [s.lower for s in c.margin.series]
                                  + [s.upper for s in c.margin.series])
                        if c.HasField("margin") else ("Multiline", list(c.multiline.tag)) for c in cat.chart})
                                for cat in proto.category})
    return out


def _matches(regex: str, tags) -> list[str]:
    return [t for t in tags if re.match(regex, t)]


def _cpu_run(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 4))
    with MemoryWriter(tmp_path, every=1, census_every=2) as writer:
        writer.watch(model)
        for step in range(4):
            model(torch.randn(8, 16)).sum().backward()
            writer.log_memory(step)
    return tmp_path


def test_a_cpu_run_gets_no_vram_section_and_no_empty_chart(tmp_path):
    from tests._events import read_events

    _cpu_run(tmp_path)
    *_, layout = layouts(tmp_path)
    tags = read_events(tmp_path).Tags()["scalars"]
    assert not [t for charts in layout.values() for t in charts if re.search("VRAM|GPU|Device memory|nvidia", t)]
    assert list(layout) == ["tbmem: memory", "tbmem: speed", "tbmem: system"]
    for category, charts in layout.items():
        for title, (kind, series) in charts.items():
            if kind == "Margin":  # looked up by exact name
                assert set(series) <= set(tags), (category, title)
            else:
                assert all(_matches(r, tags) for r in series), (category, title)  # no "Matches (0)"


def test_every_chart_has_one_unit_and_one_reading_per_colour():
    layout = custom_scalars_layout()  # every chart tbmem can draw
    for charts in layout.values():
        for title, (kind, regexes) in charts.items():
            assert UNIT.search(title), title  # the unit is in the title, once
            if kind == "Multiline" and len(regexes) > 1:
                pytest.fail(f"{title}: several readings share the run's colour")
    units = {TAGS[k].unit for k in ("large_count", "large_total")}
    assert units == {"count", "MB"}
    titles = [t for charts in layout.values() for t in charts]
    assert "Large tensors (count)" in titles and "Large tensors, total (MB)" in titles


def test_a_gpu_run_shows_vram_first(tmp_path, monkeypatch):
    install_fake_cuda(monkeypatch)
    with MemoryWriter(tmp_path, every=1, census_every=0) as writer:
        writer.log_memory(0)
    (layout,) = layouts(tmp_path)
    memory = list(layout["tbmem: memory"])
    assert memory[:2] == ["VRAM allocated (GB)", "VRAM reserved by the caching allocator (GB)"]
    assert memory.index("Process RSS (GB)") > memory.index("Out-of-memory errors since start (count)")
    assert layout["tbmem: memory"]["VRAM allocated (GB)"] == ("Margin", [TAGS["vram_allocated"].tag] * 3)
    assert "Fragmentation: reserved memory not holding tensors (%)" in layout["tbmem: GPU allocator"]


def test_one_reading_charts_are_margin_charts_which_tensorboard_never_smooths():
    layout = custom_scalars_layout()
    for charts in layout.values():
        for title, (kind, series) in charts.items():
            if kind == "Margin" and "across ranks" not in title:
                assert len(set(series)) == 1, title  # the line and its band: one reading, exact
    memory = layout["tbmem: memory"]
    assert all(kind == "Margin" for kind, _ in memory.values())
    assert memory["Large tensors (count)"] == ["Margin", [TAGS["large_count"].tag] * 3]


def test_a_speed_section(tmp_path):
    _cpu_run(tmp_path)
    *_, layout = layouts(tmp_path)
    assert "Step time, mean since the previous record (ms)" in layout["tbmem: speed"]
    assert "Census duration (ms)" in layout["tbmem: speed"]


def test_the_layout_is_rewritten_when_the_census_first_appears(tmp_path):
    with MemoryWriter(tmp_path, every=1, census_every=3) as writer:
        writer.log_memory(1)  # readings only
        writer.log_memory(2)  # the first step time: the speed chart
        writer.log_memory(3)  # the first census
        writer.log_memory(4)  # nothing new: no layout written
    first, second, third = layouts(tmp_path)
    assert "Step time, mean since the previous record (ms)" not in first.get("tbmem: speed", {})
    assert "Step time, mean since the previous record (ms)" in second["tbmem: speed"]
    census = "Census total (MB)"
    assert census not in second["tbmem: memory"] and census in third["tbmem: memory"]


def test_tensorboard_shows_the_latest_layout_of_a_run(tmp_path):
    """TensorBoard's custom-scalars plugin reads the last layout a run wrote (downsample to 1 point)."""
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins.custom_scalar import custom_scalars_plugin
    from tensorboard.plugins import base_plugin
    from tensorboard import context

    with MemoryWriter(tmp_path / "run", every=1, census_every=3) as writer:
        for step in range(1, 4):
            writer.log_memory(step)
    multiplexer = plugin_event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(str(tmp_path))
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, str(tmp_path))
    plugin = custom_scalars_plugin.CustomScalarsPlugin(base_plugin.TBContext(
        logdir=str(tmp_path), multiplexer=multiplexer, data_provider=provider))
    served = plugin.layout_impl(context.RequestContext(), "")
    served = json.loads(served) if isinstance(served, (str, bytes)) else served
    memory = next(c for c in served["category"] if c["title"] == "tbmem: memory")
    assert "Census total (MB)" in [chart["title"] for chart in memory["chart"]]


def test_census_categories_get_a_chart_each_in_priority_order(tmp_path):
    _cpu_run(tmp_path)
    *_, layout = layouts(tmp_path)
    titles = [t for t in layout["tbmem: memory"] if t.startswith("Census: ")][:6]
    assert titles == [f"Census: {c} (MB)" for c in ("parameters", "gradients", "optimizer_state", "buffers",
                                                   "activations", "other")]


def test_families_get_a_chart_each_up_to_a_few_members():
    few = [TAGS["census_dtype"].tag.format(name=n) for n in ("float32", "int64")]
    many = [TAGS["census_module"].tag.format(name=f"model.layer{i}") for i in range(MAX_SEPARATE + 1)]
    layout = custom_scalars_layout(few + many)
    tensors = layout["tbmem: memory"]
    assert "Census by dtype: float32 (MB)" in tensors and "Census by dtype: int64 (MB)" in tensors
    assert not [t for t in tensors if t.startswith("Census by module")]
    # several lines on one chart (a Multiline chart, smoothed by the dashboard) in a section of its own
    (shared,) = layout["tbmem: census, one chart per family"]
    assert shared.startswith("Census by module")
    kind, regexes = layout["tbmem: census, one chart per family"][shared]
    assert kind == "Multiline" and len(_matches(regexes[0], many)) == MAX_SEPARATE + 1


def test_process_tree_charts_only_once_there_are_workers():
    tracker = LayoutTracker()
    rss, workers = TAGS["ram_rss"].tag, TAGS["ram_tree_workers"].tag
    first = tracker.see({rss: 0.4, workers: 0.0, TAGS["ram_tree_rss"].tag: 0.4})
    assert not any("workers" in t for t in first["tbmem: memory"])
    assert tracker.see({rss: 0.4, workers: 0.0}) is None
    later = tracker.see({rss: 0.5, workers: 2.0})
    assert "Processes below the training process (count)" in later["tbmem: memory"]


def test_tensorboard_shows_the_charts_unsmoothed_in_the_layouts_order(tmp_path):
    """In TensorBoard's custom-scalars dashboard (headless Chromium): every chart of the memory section is a
    margin chart (never smoothed), shown in custom_scalars_layout's order (display_order undoes the
    dashboard's reversal of margin charts)."""
    from tests._browser import chromium
    from tests.plugin._logdir import Server

    *_, expected = layouts(_cpu_run(tmp_path / "logs" / "run"))  # the last one written, in reading order
    srv = Server(tmp_path, "--logdir", str(tmp_path / "logs"), wait_run="run")
    try:
        with chromium() as browser:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{srv.base}/#custom_scalars")
            cards = []
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and len(cards) < len(expected["tbmem: memory"]):
                page.wait_for_timeout(500)
                cards = page.evaluate("""() => { const out = [];
                    const walk = (root) => { for (const el of root.querySelectorAll('*')) {
                        if (/^TF-CUSTOM-SCALAR-.*-CARD$/.test(el.tagName)) out.push([el.tagName, el.title]);
                        if (el.shadowRoot) walk(el.shadowRoot); } };
                    walk(document); return out; }""")
    finally:
        srv.stop()
    memory = list(expected["tbmem: memory"])
    shown = [title for _, title in cards]
    assert shown[:len(memory)] == memory
    assert {kind for kind, _ in cards[:len(memory)]} == {"TF-CUSTOM-SCALAR-MARGIN-CHART-CARD"}
