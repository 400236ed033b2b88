"""Live memory at an out-of-memory error by category: a tensor census taken at the error.

At an out-of-memory error the device has no room, but the census needs none: its heap pass
(``tbmem/_internal/census/_gcwalk.c``) and its tables allocate host memory only, and it reads each
tensor's storage from torch's C++ objects without touching the device. So the writer takes one
at the error (where its census is on: ``census_every > 0``), before the snapshot is written, and
the explanation says which categories filled the device: parameters, gradients, optimizer
state, buffers, activations, other, and the bytes the allocator holds that no census could name
(``unattributed``: allocated minus what the census counted on that device).

:func:`census_doc` is the plain-data form stored in the out-of-memory snapshot (``meta["oom_census"]``)
and read back by ``tbmem snapshot stats``; :func:`on_device` and :func:`elsewhere` select from it.
Nothing here imports torch except :func:`take_at_oom`.

Example:
    >>> doc = {"devices": {"cuda:0": {"parameters": 4096, "gradients": 4096}, "cpu": {"other": 512}},
    ...        "unattributed": {"cuda:0": 1024}}
    >>> on_device(doc, "cuda:0")["unattributed"], elsewhere(doc, "cuda:0")
    (1024, {'cpu': {'other': 512}})
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from tbmem._internal._log import report_once

__all__ = ["CATEGORIES", "census_doc", "on_device", "elsewhere", "oom_census", "take_at_oom"]

#: The census's categories (:data:`tbmem._internal.census.CATEGORIES`, repeated here so that reading a file needs no torch).
CATEGORIES = ("parameters", "gradients", "optimizer_state", "buffers", "activations", "other")


def census_doc(census: Any, *, device: str | None = None, where: str = "at the out-of-memory error") -> dict[str, Any]:
    """A :class:`tbmem.Census` as plain data: bytes per device and category, the unattributed
    bytes of ``device`` (the CUDA device the census was taken for), how long it took."""
    devices: dict[str, dict[str, int]] = {}
    for r in census.records:
        cats = devices.setdefault(str(r.device), dict.fromkeys(CATEGORIES, 0))
        cats[r.category] = cats.get(r.category, 0) + int(r.bytes)
    doc: dict[str, Any] = {"devices": devices, "unattributed": {}, "where": where,
                           "duration_s": round(float(census.duration_s), 4)}
    if census.unattributed_bytes is not None and device is not None:
        doc["unattributed"][device] = int(census.unattributed_bytes)
    return doc


def _ints(value: Any) -> dict[str, int]:
    """The integer entries of a mapping from a file (anything else dropped: the file is not trusted)."""
    if not isinstance(value, Mapping):
        return {}
    return {str(k): int(v) for k, v in value.items() if isinstance(v, int) and not isinstance(v, bool)}


def on_device(doc: Mapping[str, Any], device: str) -> dict[str, int]:
    """Bytes per category the census found on ``device`` (every category, zeros included), and
    ``unattributed`` where the census knows it for that device."""
    devices = doc.get("devices")
    found = _ints(devices.get(device)) if isinstance(devices, Mapping) else {}
    out = {c: found.get(c, 0) for c in CATEGORIES}
    out.update({k: v for k, v in found.items() if k not in out})
    unattributed = _ints(doc.get("unattributed")).get(device)
    if unattributed is not None:
        out["unattributed"] = unattributed
    return out


def elsewhere(doc: Mapping[str, Any], device: str) -> dict[str, dict[str, int]]:
    """The categories with bytes on the other devices (the host's ``cpu`` among them)."""
    devices = doc.get("devices")
    if not isinstance(devices, Mapping):
        return {}
    out = {}
    for name, cats in devices.items():
        kept = {k: v for k, v in _ints(cats).items() if v}
        if str(name) != device and kept:
            out[str(name)] = kept
    return out


def oom_census(snap: Any) -> Mapping[str, Any] | None:
    """The census a snapshot file recorded at its out-of-memory error (``meta["oom_census"]``), or None."""
    doc = snap.meta.get("oom_census")
    return doc if isinstance(doc, Mapping) and isinstance(doc.get("devices"), Mapping) else None


def take_at_oom(models: Iterable[Any], optimizers: Iterable[Any], device: int | None) -> dict[str, Any] | None:
    """A census now, as :func:`census_doc`; None (reported once) where it fails. Never raises."""
    try:
        from tbmem._internal.census import take_census

        start = time.perf_counter()
        census = take_census(models=list(models), optimizers=list(optimizers), device=device, numpy_scan="off")
        doc = census_doc(census, device=f"cuda:{device if device is not None else _current()}")
        doc["duration_s"] = round(time.perf_counter() - start, 4)
        return doc
    except Exception as err:  # noqa: BLE001 - the OOM must reach the user, not this
        report_once("oom:census", "tbmem: could not take a census at the out-of-memory error", exc=err)
        return None


def _current() -> int:
    from tbmem._internal import _torch_private as tp

    index = tp.cuda_current_device()
    return 0 if index is None else index
