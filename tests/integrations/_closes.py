"""Who closes which TensorBoard writer in a test: each close of an open ``SummaryWriter``, with the packages on
the stack that called it."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from torch.utils.tensorboard import SummaryWriter

__all__ = ["Closes", "is_open"]


def is_open(writer: Any) -> bool:
    """Whether a ``SummaryWriter`` (a framework's, or a MemoryWriter) is open: ``close()`` drops its file writers."""
    return writer is not None and getattr(writer, "all_writers", None) is not None


class Closes:
    """Spies on ``SummaryWriter.close`` (the frameworks' writers are torch's) for the test's duration."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[Any, frozenset[str]]] = []
        original = SummaryWriter.close

        def close(writer: SummaryWriter) -> None:
            if is_open(writer):
                self.calls.append((writer, _packages(sys._getframe(1))))
            original(writer)

        monkeypatch.setattr(SummaryWriter, "close", close)

    def of(self, writer: Any) -> list[frozenset[str]]:
        """The packages on the stack of each close of ``writer``."""
        return [packages for w, packages in self.calls if w is writer]


def _packages(frame: Any) -> frozenset[str]:
    found = set()
    while frame is not None:
        found.add(str(frame.f_globals.get("__name__", "")).partition(".")[0])
        frame = frame.f_back
    return frozenset(found)
