"""The console API's siblings take their arguments alike (docs/console-api.md); the positional forms of
before 0.2 still work, with a DeprecationWarning."""

from __future__ import annotations

import inspect
import io

import pytest

from tbmem import console
from tbmem._internal.writer import MemoryWriter

MONITORS = ["MemoryTracker", "EpochMemoryMonitor", "BatchMemoryProfiler", "PerformanceMonitor",
            "EpochPerformanceMonitor"]
CONTEXTS = ["track_memory", "track_performance"]


@pytest.mark.parametrize("name", MONITORS + CONTEXTS)
def test_siblings_take_device_writer_and_file_by_keyword_with_none(name):
    params = inspect.signature(getattr(console, name)).parameters
    for key in ("device", "writer", "file"):
        assert params[key].kind is inspect.Parameter.KEYWORD_ONLY, (name, key)
        assert params[key].default is None, (name, key)
    if name in MONITORS:
        assert next(iter(params)) == "enabled" and params["enabled"].default is True


def test_the_top_level_names_are_the_console_ones():
    import tbmem

    for name in console.__all__:
        if name in tbmem.__all__:
            assert getattr(tbmem, name) is getattr(console, name)
    assert {"MemoryMonitor", "EpochPerformanceMonitor", "track_performance", "monitor_performance"} <= set(
        tbmem.__all__)


def test_old_positional_forms_warn_and_mean_what_they_meant(tmp_path):
    out = io.StringIO()
    with MemoryWriter(str(tmp_path)) as writer:
        with pytest.warns(DeprecationWarning, match=r"EpochMemoryMonitor\(\): pass writer=, file= by keyword"):
            epoch = console.EpochMemoryMonitor(True, 3, writer, out)
        assert epoch.file is out and epoch._sink is not None and epoch.verbose_batches == 3
    with pytest.warns(DeprecationWarning, match="device="):
        perf = console.EpochPerformanceMonitor(True, 5, 2)
    assert perf.device == 2
    with pytest.warns(DeprecationWarning, match="device="):
        assert console.PerformanceMonitor(True, 1).device == 1
    with pytest.warns(DeprecationWarning, match="print_result=, device="):
        with console.track_performance("quiet", False, None, file=out):
            pass
    assert "quiet" not in out.getvalue()

    with pytest.warns(DeprecationWarning, match="monitor_performance"):
        @console.monitor_performance("job", 0, file=out)
        def job() -> int:
            return 7

    assert job() == 7 and "job" in out.getvalue()
    with pytest.raises(TypeError, match="at most 1 more positional"):
        console.PerformanceMonitor(True, 0, 1)


def test_the_keyword_forms_do_not_warn():
    out = io.StringIO()
    assert console.EpochPerformanceMonitor(True, 5, device=None, file=out).device is None
    assert console.PerformanceMonitor(enabled=True, file=out).device is None  # was device 0
    with console.track_performance("loud", print_result=True, file=out):
        pass
    with console.track_memory("quiet", print_result=False, file=out):
        pass
    assert "loud" in out.getvalue() and "quiet" not in out.getvalue()
