"""Shared fixtures: reading event files back with TensorBoard's own loader."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tbmem._log import forget_reports


def read_events(logdir: str | Path) -> EventAccumulator:
    """Load every event file in ``logdir`` (one run) with TensorBoard's EventAccumulator."""
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def scalars(logdir: str | Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) pairs of one scalar tag."""
    return [(e.step, e.value) for e in read_events(logdir).Scalars(tag)]


@pytest.fixture(autouse=True)
def _fresh_reports():
    """Each test sees "report once" warnings afresh."""
    forget_reports()
    yield
    forget_reports()


@pytest.fixture
def tbmem_log(caplog):
    """Capture the tbmem logger at WARNING."""
    caplog.set_level(logging.WARNING, logger="tbmem")
    return caplog
