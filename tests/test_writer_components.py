"""The writer's step path loops over the configured components only (tbmem._internal._writer_components): an
unconfigured one is not in the loop, each hook's tuple holds the components that implement it in the
order they run, a failing one is reported once and leaves every tuple, ``begin_step`` lets a loop skip
steps once no component needs every step, and no component can reach the writer."""

from __future__ import annotations

import functools
import types

import pytest
import torch

from tbmem import MemoryWriter
from tbmem._internal._emit import Emitter
from tbmem._internal.snapshot import SnapshotConfig, SnapshotManager
from tbmem._internal.tags import TAGS
from tests._events import scalars, texts

_SNAPSHOTS = SnapshotConfig(every=0, html=False, pickle=False)
_EVERYTHING = dict(every=10, census_every=5, snapshot=_SNAPSHOTS, alerts=True, spikes=True,
                   profile={"every": 50, "steps": 2, "start": 50})


def _names(parts):
    return [c.name for c in parts]


def test_only_the_configured_components_are_in_the_step_loop(tmp_path):
    with MemoryWriter(tmp_path / "plain", every=10, census_every=0) as w:
        assert _names(w._components.all) == ["probes"] and not w.begin_step(1) and w.begin_step(10)
    with MemoryWriter(tmp_path / "off", enabled=False) as w:
        assert w._components.all == ()
    with MemoryWriter(tmp_path / "both", every=10, census_every=0, snapshot=_SNAPSHOTS, alerts=True) as w:
        parts = w._components
        assert _names(parts.all) == ["probes", "snapshots", "alerts"]
        assert _names(parts.each_step) == ["snapshots"] and _names(parts.on_due) == ["probes", "alerts"]
        assert w.begin_step(1)  # the snapshot manager sees every step


def test_each_hook_runs_its_components_in_the_order_of_a_step(tmp_path):
    with MemoryWriter(tmp_path, **_EVERYTHING) as w:
        parts = w._components
        # a window opens before the record and closes after it and the census
        assert _names(parts.on_due) == ["profile", "probes", "alerts", "census", "profile"]
        assert _names(parts.each_step) == ["snapshots"] and _names(parts.on_begin) == ["profile"]
        assert _names(parts.on_scalars) == ["profile", "spikes"]
        assert _names(parts.on_oom) == ["profile", "snapshots"]
        assert parts.wake_at == 49  # the record of the step before the window opens it


def test_a_failing_component_is_reported_once_and_leaves_the_loop(tmp_path, monkeypatch, tbmem_log):
    calls = []

    def broken(self, step):
        calls.append(step)
        raise RuntimeError("schedule broke")

    monkeypatch.setattr(SnapshotManager, "on_step", broken)
    with MemoryWriter(tmp_path, every=2, census_every=0, snapshot=_SNAPSHOTS) as w:
        assert w.begin_step(1)
        for step in range(6):
            w.log_memory(step)
        assert calls == [0]  # switched off at its first failure
        assert _names(w._components.all) == ["probes"]
        assert not w.begin_step(1)  # nothing needs every step any more: the loop may skip steps
    failures = [r.getMessage() for r in tbmem_log.records if "snapshots failed" in r.getMessage()]
    assert len(failures) == 1 and "schedule broke" in failures[0]
    # the records go on: the component's failure is not the writer's
    assert [s for s, _ in scalars(tmp_path, TAGS["ram_rss"].tag)] == [0, 2, 4]


def test_a_failing_census_is_switched_off_and_undoes_its_heap_capture(tmp_path, monkeypatch, tbmem_log):
    from tbmem._internal.census import heap

    def broken(**kwargs):
        raise RuntimeError("census broke")

    monkeypatch.setattr("tbmem._internal.census.take_census", broken)
    users = heap._capture_users
    with MemoryWriter(tmp_path, every=1, census_every=2) as w:
        assert heap._capture_users == users + 1
        for step in range(5):
            w.log_memory(step)
        assert _names(w._components.all) == ["probes"] and heap._capture_users == users
    assert [s for s, _ in scalars(tmp_path, TAGS["ram_rss"].tag)] == [0, 1, 2, 3, 4]
    assert sum("census failed and is switched off" in r.getMessage() for r in tbmem_log.records) == 1


def _reaches(start: object, target: object, limit: int = 200_000) -> bool:
    """Whether ``target`` is reachable from ``start`` through instances, containers, bound methods,
    closures and partials (not modules, classes or a function's globals), stopping at an Emitter:
    the one sanctioned way out of a component."""
    seen: set[int] = set()
    todo = [start]
    while todo and len(seen) < limit:
        obj = todo.pop()
        if obj is target:
            return True
        if id(obj) in seen or isinstance(obj, (Emitter, types.ModuleType, type, str, bytes, int, float)):
            continue
        seen.add(id(obj))
        if isinstance(obj, types.MethodType):
            todo += [obj.__self__, obj.__func__]
        elif isinstance(obj, types.FunctionType):
            todo += [c.cell_contents for c in obj.__closure__ or () if c.cell_contents is not None]
            todo += list(obj.__defaults__ or ())
        elif isinstance(obj, functools.partial):
            todo += [obj.func, *obj.args, *obj.keywords.values()]
        elif isinstance(obj, dict):
            todo += list(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            todo += list(obj)
        elif isinstance(obj, torch.Tensor):
            continue
        else:
            todo += list(getattr(obj, "__dict__", {}).values())
            for klass in type(obj).__mro__:
                for slot in getattr(klass, "__slots__", ()):
                    value = getattr(obj, slot, None)
                    if value is not None:
                        todo.append(value)
    return False


def test_no_component_can_reach_the_writer(tmp_path):
    model = torch.nn.Linear(4, 4)
    with MemoryWriter(tmp_path, **_EVERYTHING) as w:
        w.watch(model)
        for step in range(3):
            w.add_scalar("Loss/train", 1.0, step)
            w.log_memory(step)
        assert _names(w._components.all) == ["profile", "probes", "snapshots", "alerts", "census", "spikes",
                                            "profile"]
        for component in w._components.all:
            assert not _reaches(component, w), f"{component.name} reaches the writer"
        # the check can fail: a component handed the writer reaches it
        assert _reaches(types.SimpleNamespace(writer=w), w)
        assert _reaches(types.SimpleNamespace(write=w.write_scalars), w)


def test_components_emit_through_the_sinks_tensorboard_first(tmp_path):
    got = []

    class Sink:
        def log(self, values, step):
            got.append(("log", step))

        def log_text(self, tag, text, step):
            got.append((tag, step))

        def log_artifact(self, path, kind):
            got.append((kind, path))

        def close(self):
            pass

    with MemoryWriter(tmp_path, every=1, census_every=2, custom_layout=False, sinks=[Sink()]) as w:
        assert w._sinks.tensorboard is w._tensorboard and w._sinks.sinks[0].__class__ is Sink
        for step in range(3):
            w.log_memory(step)
    census = TAGS["census_text"].tag
    assert [s for s, _ in texts(tmp_path, census)] == [0, 2]
    assert [(t, s) for t, s in got if t == census] == [(census, 0), (census, 2)]
    assert sorted({s for t, s in got if t == "log"}) == [0, 1, 2]


@pytest.mark.parametrize("flush_each_record", [True, False])
def test_the_record_reaches_the_file_through_the_tensorboard_sink(tmp_path, flush_each_record):
    with MemoryWriter(tmp_path, every=1, census_every=0, flush_each_record=flush_each_record) as w:
        for step in range(3):
            w.log_memory(step)
            # written on this thread (nothing left in TensorBoard's queue), or queued
            assert w._tensorboard.pending is not flush_each_record
        if flush_each_record:  # in the file before close
            assert [s for s, _ in scalars(tmp_path, TAGS["ram_rss"].tag)] == [0, 1, 2]
    assert [s for s, _ in scalars(tmp_path, TAGS["ram_rss"].tag)] == [0, 1, 2]
