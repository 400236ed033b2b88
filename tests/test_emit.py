"""The components of a MemoryWriter emit through an Emitter, never the writer: what they emit takes the
writer's one output path (the event file and every sink)."""

from __future__ import annotations

import gc

from tbmem import MemoryWriter
from tbmem._internal._emit import Emitter
from tbmem._internal.alerts import ALERTS_TEXT_TAG
from tbmem._internal.spikes import SPIKES_TEXT_TAG, read_spikes
from tests._events import texts

QUIET = {"device_percent": None, "growth_mb_per_1k": None, "rss_growth_mb_per_1k": None, "alloc_retries": False}


class _Sink:
    def __init__(self) -> None:
        self.texts: list[tuple[str, int]] = []

    def log(self, values, step):
        pass

    def log_text(self, tag, text, step):
        self.texts.append((tag, step))

    def log_artifact(self, path, kind):
        pass

    def close(self):
        pass


def test_alerts_and_spikes_reach_the_event_file_and_the_sinks(tmp_path):
    sink = _Sink()
    with MemoryWriter(tmp_path, every=1, census_every=0, custom_layout=False, sinks=[sink],
                      alerts={**QUIET, "host_percent": 0.1}, spikes={"window": 5, "min_history": 3}) as w:
        # the components hold an emitter, not the writer
        for component in (w._alerts, w._spikes):
            assert isinstance(component.emit, Emitter)
            assert not any(r is w for r in gc.get_referents(component))
        w.log_memory(0)  # system RAM above 0.1 %: an alert
        for step, loss in enumerate([1.0, 1.0, 1.0, 1.0, 9.0], start=1):
            w.add_scalar("Loss/train", loss, step)
    assert [s for s, _ in texts(tmp_path, ALERTS_TEXT_TAG)] == [0]
    assert [s for s, _ in texts(tmp_path, SPIKES_TEXT_TAG)] == [5]
    assert [(s["tag"], s["step"]) for s in read_spikes(str(tmp_path))] == [("Loss/train", 5)]
    # the same text entries went to the sink, on the same steps
    assert (ALERTS_TEXT_TAG, 0) in sink.texts and (SPIKES_TEXT_TAG, 5) in sink.texts
