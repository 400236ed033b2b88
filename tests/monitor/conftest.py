"""Fixtures for the console-monitor tests: output state reset, a fake GPU, an event-file reader."""

from __future__ import annotations

from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader

from tbmem._internal.monitor import output
from tests.fake_cuda import FakeCuda, install_fake_cuda

MiB = 2**20


@pytest.fixture(autouse=True)
def _fresh_output():
    """Each test starts with output to sys.stdout and not silenced."""
    previous_target, previous_silent = output.set_output(None), output.set_silent(False)
    yield
    output.set_output(previous_target)
    output.set_silent(previous_silent)


@pytest.fixture
def fake_gpu(monkeypatch) -> FakeCuda:
    """An initialised fake CUDA device: 100 MB allocated, 300 MB reserved, peak 150 MB."""
    fake = FakeCuda(allocated=100 * MiB, reserved=300 * MiB, peak_allocated=150 * MiB, peak_reserved=300 * MiB)
    return install_fake_cuda(monkeypatch, fake)


def value_events(logdir: str | Path) -> list[tuple[int, dict[str, float]]]:
    """(step, {tag: value}) for every event that carries scalar values, in file order."""
    out = []
    for path in sorted(Path(logdir).glob("events.out.tfevents.*")):
        for event in LegacyEventFileLoader(str(path)).Load():
            if event.HasField("summary"):
                values = {v.tag: v.simple_value for v in event.summary.value if v.HasField("simple_value")}
                if values:
                    out.append((event.step, values))
    return out
