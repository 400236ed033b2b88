"""Read event files back with TensorBoard's own loader (used by every test package)."""

from __future__ import annotations

from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

__all__ = ["read_events", "scalars", "texts"]


def read_events(logdir: str | Path) -> EventAccumulator:
    """Load every event file in ``logdir`` (one run) with TensorBoard's EventAccumulator."""
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def scalars(logdir: str | Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) pairs of one scalar tag."""
    return [(e.step, e.value) for e in read_events(logdir).Scalars(tag)]


def texts(logdir: str | Path, tag: str) -> list[tuple[int, str]]:
    """(step, text) pairs of one text tag written with add_text (which appends ``/text_summary``)."""
    if not tag.endswith("/text_summary"):
        tag += "/text_summary"
    out = []
    for e in read_events(logdir).Tensors(tag):
        out.append((e.step, e.tensor_proto.string_val[0].decode("utf-8")))
    return out
