"""The ledger: claims storages for categories in priority order, each storage once.

Example:
    >>> import torch
    >>> from tbmem.census.categorize import Ledger
    >>> w = torch.zeros(10, 10)
    >>> ledger = Ledger()
    >>> ledger.claim(w, "parameters", "w")
    >>> ledger.claim(w.t(), "other", "w.T")  # a view: same storage, already counted
    >>> [(r.name, r.category, r.bytes) for r in ledger.records()]
    [('w', 'parameters', 400)]
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import Any

import numpy as np
import torch

from tbmem._log import report_once
from tbmem.census import heap, scan
from tbmem.census.report import TensorRecord

__all__ = ["Ledger"]


class Ledger:
    """Storage key -> record; the first claim of a storage wins.

    Claims must come in category priority order (parameters first, other last):
    that makes "a storage counts in its highest-priority category" a dict lookup.
    Failures to measure one tensor are reported once per kind and noted; the
    census goes on.

    Args:
        ttypes: The tensor types of this census (to recognise ``tensor.numpy()`` arrays).
    """

    def __init__(self, ttypes: set[type] | None = None) -> None:
        self.ttypes = ttypes if ttypes is not None else heap.tensor_types()
        self._records: dict[tuple[str, int], TensorRecord] = {}
        self._seen: set[int] = set()
        self._keep: list[Any] = []  # holds claimed objects so their ids stay unique
        self._numpy_keys: set[tuple[str, int]] = set()
        self.notes: list[str] = []

    def seen(self, obj: Any) -> bool:
        """Whether this very object was claimed already (cheap skip before measuring)."""
        return id(obj) in self._seen

    def _note(self, key: str, message: str, exc: BaseException | None = None) -> None:
        if report_once(f"census:{key}", f"tbmem census: {message}", exc=exc):
            self.notes.append(message)
        elif message not in self.notes and len(self.notes) < 20:
            self.notes.append(message)

    def claim(self, t: torch.Tensor, category: str, name: str, module: str | None = None) -> None:
        """Count the storages of ``t`` under ``category`` unless counted already."""
        if id(t) in self._seen:
            return
        self._seen.add(id(t))
        self._keep.append(t)
        try:
            storages = scan.tensor_storages(t)
            shape = tuple(t.shape) if storages else ()
        except scan.NoStorageError as exc:
            self._note(f"nostorage:{type(t).__name__}", f"{type(t).__name__} tensors without storage", exc)
            return
        except Exception as exc:  # noqa: BLE001 - a user subclass may raise anything; count the rest
            self._note(f"tensor:{type(t).__name__}", f"a {type(t).__name__} could not be measured", exc)
            return
        for st in storages:
            if st.key not in self._records:
                self._records[st.key] = TensorRecord(name=name, category=category, shape=shape,
                                                     dtype=st.dtype, device=st.device, bytes=st.nbytes,
                                                     module=module)

    def claim_array(self, a: np.ndarray, name: str) -> None:
        """Count a numpy array's base buffer as host memory, category ``other``."""
        if id(a) in self._seen:
            return
        self._seen.add(id(a))
        self._keep.append(a)
        try:
            st = scan.array_storage(a, self.ttypes)
        except (AttributeError, TypeError, ValueError) as exc:
            self._note("array", "a numpy array could not be measured", exc)
            return
        if st is None:
            return
        if not isinstance(st, scan.Storage):  # a view of a tensor: count the tensor
            self.claim(st, "other", name + " (torch)")
            return
        if st.key not in self._records:
            self._records[st.key] = TensorRecord(name=name, category="other", shape=tuple(a.shape),
                                                 dtype=st.dtype, device="cpu", bytes=st.nbytes)
            self._numpy_keys.add(st.key)

    def records(self) -> list[TensorRecord]:
        """All records so far, each byte once.

        A torch storage made with ``torch.from_numpy`` of a slice starts inside the
        array's base buffer, so the two keys differ while the bytes are shared. The torch
        storage keeps its bytes (it was claimed at a higher or equal priority); the numpy
        record keeps only the bytes no torch storage covers.
        """
        if not self._numpy_keys:
            return list(self._records.values())
        spans = sorted((key[1], key[1] + rec.bytes) for key, rec in self._records.items()
                       if key[0] == "cpu" and key not in self._numpy_keys)
        starts = [start for start, _ in spans]
        out = []
        for key, rec in self._records.items():
            if key in self._numpy_keys:
                shared = _covered(key[1], key[1] + rec.bytes, spans, starts)
                if shared:
                    if shared >= rec.bytes:
                        continue
                    rec = dataclasses.replace(rec, bytes=rec.bytes - shared)
            out.append(rec)
        return out

    def bytes_on(self, device: str) -> int:
        """Census bytes on one device (for the unattributed reading)."""
        return sum(r.bytes for r in self.records() if r.device == device)


def _covered(lo: int, hi: int, spans: list[tuple[int, int]], starts: list[int]) -> int:
    """Bytes of ``[lo, hi)`` inside the sorted, disjoint ``spans``."""
    covered = 0
    i = max(bisect.bisect_right(starts, lo) - 1, 0)
    while i < len(spans) and spans[i][0] < hi:
        start, end = spans[i]
        covered += max(0, min(end, hi) - max(start, lo))
        i += 1
    return covered
