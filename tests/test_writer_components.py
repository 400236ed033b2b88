"""The writer's step path loops over the configured components only (tbmem._internal._writer_components): an
unconfigured one is not in the loop, a failing one is reported once and leaves it, and the fast
path (``next_due`` skipping steps) returns once no component needs every step."""

from __future__ import annotations

from tbmem import MemoryWriter
from tbmem._internal.snapshot import SnapshotConfig, SnapshotManager
from tbmem._internal.tags import TAGS
from tests._events import scalars

_SNAPSHOTS = SnapshotConfig(every=0, html=False, pickle=False)


def _names(parts):
    return [c.name for c in parts]


def test_only_the_configured_components_are_in_the_step_loop(tmp_path):
    with MemoryWriter(tmp_path / "plain", every=10, census_every=0) as w:
        assert w._components.all == () and w.next_due(1) == 10
    with MemoryWriter(tmp_path / "both", every=10, census_every=0, snapshot=_SNAPSHOTS, alerts=True) as w:
        parts = w._components
        assert _names(parts.all) == ["snapshots", "alerts"]
        assert _names(parts.each_step) == ["snapshots"] and _names(parts.on_record) == ["alerts"]
        assert w.next_due(1) == 1


def test_a_failing_component_is_reported_once_and_leaves_the_loop(tmp_path, monkeypatch, tbmem_log):
    calls = []

    def broken(self, step):
        calls.append(step)
        raise RuntimeError("schedule broke")

    monkeypatch.setattr(SnapshotManager, "on_step", broken)
    with MemoryWriter(tmp_path, every=2, census_every=0, snapshot=_SNAPSHOTS) as w:
        assert w.next_due(1) == 1
        for step in range(6):
            w.log_memory(step)
        assert calls == [0]  # switched off at its first failure
        assert w._snapshots is None and w._components.all == ()
        assert w.next_due(1) == 2  # nothing needs every step any more: the loop may skip steps
    failures = [r.getMessage() for r in tbmem_log.records if "snapshots failed" in r.getMessage()]
    assert len(failures) == 1 and "schedule broke" in failures[0]
    # the records go on: the component's failure is not the writer's
    assert [s for s, _ in scalars(tmp_path, TAGS["ram_rss"].tag)] == [0, 2, 4]
