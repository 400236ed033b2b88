"""Every ``oom`` event of a snapshot file explained (``tbmem snapshot stats``, the snapshot page, the tests).

Example:
    >>> from pathlib import Path
    >>> from tbmem._internal.snapshot.readers import load_snapshot
    >>> snap = load_snapshot(Path("tests/data/h200/oom.pickle"))
    >>> [(dev.name, x.verdict) for dev, x in explain_snapshot(snap)]
    [('cuda:0', 'device_full')]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from tbmem._internal.oom.census import oom_census
from tbmem._internal.oom.explain import OomExplanation, explain_device
from tbmem._internal.snapshot.stats import attribution

__all__ = ["explain_snapshot"]


def explain_snapshot(snap: Any, *, device_total: int | None = None, retries: int | None = None,
                     census: Mapping[str, Any] | None = None, settings: Mapping[str, Any] | None = None,
                     site_of_stack: np.ndarray | None = None) -> list[tuple[Any, OomExplanation]]:
    """Every ``oom`` event of a :class:`~tbmem.Snapshot` explained, as (device, explanation).

    ``settings`` and ``census`` default to what the snapshot recorded (``meta["allocator_settings"]``,
    ``meta["oom_census"]``).
    """
    if site_of_stack is None:
        site_of_stack = attribution(snap)
    recorded = settings if settings is not None else snap.meta.get("allocator_settings")
    census = census if census is not None else oom_census(snap)
    out = []
    for dev in snap.devices:
        for oom in dev.ooms:
            out.append((dev, explain_device(dev, oom, categories=snap.categories, strings=snap.strings,
                                            frames=snap.frames, stacks=snap.stacks, settings=recorded,
                                            site_of_stack=site_of_stack, rank=snap.rank, step=snap.step,
                                            device_total=device_total, retries=retries, census=census)))
    return out
