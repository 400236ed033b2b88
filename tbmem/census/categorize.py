"""The ledger: claims memory for categories in priority order, each byte once.

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

__all__ = ["Ledger", "FOREIGN_OWNER"]

#: Blind spot: bytes of tensors over memory torch did not allocate whose owner no scan found.
FOREIGN_OWNER = "foreign_memory_owner_not_found"

_Key = tuple[str, int, int]  # (device, address, nbytes)
_new = object.__new__


def _record(name: str, category: str, shape: tuple[int, ...], dtype: str, device: str, nbytes: int,
            module: str | None) -> TensorRecord:
    """``TensorRecord(...)``, equal in every way, at less than half the cost: a frozen dataclass's
    ``__init__`` sets each field through ``object.__setattr__`` (1.5 us a record, a hundred per census)."""
    rec = _new(TensorRecord)
    rec.__dict__.update(name=name, category=category, shape=shape, dtype=dtype, device=device, bytes=nbytes,
                        module=module)
    return rec


class Ledger:
    """Memory block -> record; the first claim of a byte wins.

    Claims must come in category priority order (parameters first, other last):
    that makes "memory counts in its highest-priority category" a first-come rule.
    Blocks are identified by device, address and size; blocks that overlap without
    being the same (two ``from_numpy`` tensors over parts of one array, an array and
    a tensor over its first half) are resolved byte by byte in :meth:`records`.
    Failures to measure one tensor are reported once per kind and noted; the
    census goes on.

    Args:
        ttypes: The tensor types of this census (to recognise ``tensor.numpy()`` arrays).
    """

    def __init__(self, ttypes: set[type] | frozenset[type] | None = None) -> None:
        self.ttypes = ttypes if ttypes is not None else heap.tensor_types()
        self._records: dict[_Key, TensorRecord] = {}
        self._seen: set[int] = set()
        self._keep: list[Any] = []  # holds claimed objects so their ids stay unique
        self._numpy_keys: set[_Key] = set()
        self._foreign: set[_Key] = set()
        self._final: list[TensorRecord] | None = None
        self.notes: list[str] = []
        #: Named limitations -> bytes they concern (see :attr:`tbmem.census.Census.blind_spots`).
        self.blind_spots: dict[str, int] = {}

    def seen(self, obj: Any) -> bool:
        """Whether this very object was claimed already (cheap skip before measuring)."""
        return id(obj) in self._seen

    def _note(self, key: str, message: str, exc: BaseException | None = None, *, warn: bool = True) -> None:
        """Add a note to the census; a failure (``warn``) is also logged, once per key."""
        if warn and report_once(f"census:{key}", f"tbmem census: {message}", exc=exc):
            self.notes.append(message)
        elif message not in self.notes and len(self.notes) < 20:
            self.notes.append(message)

    def _first(self, obj: Any) -> bool:
        if id(obj) in self._seen:
            return False
        self._seen.add(id(obj))
        self._keep.append(obj)
        self._final = None
        return True

    def _add(self, storages: list[scan.Storage], category: str, name: str, module: str | None,
             numpy: bool = False) -> None:
        for (where, address), nbytes, dtype, device, shape, foreign in storages:  # scan.Storage's fields
            key = (where, address, nbytes)
            if key not in self._records:
                self._records[key] = _record(name, category, shape, dtype, device, nbytes, module)
                if numpy:
                    self._numpy_keys.add(key)
                elif foreign:
                    self._foreign.add(key)

    def claim(self, t: torch.Tensor, category: str, name: str, module: str | None = None) -> None:
        """Count the storages of ``t`` under ``category`` unless counted already."""
        if id(t) in self._seen:  # self._first(t), inlined: a hundred claims per census
            return
        self._seen.add(id(t))
        self._keep.append(t)
        self._final = None
        try:
            storages = scan.tensor_storages(t)
        except scan.NoStorageError as exc:
            self._note(f"nostorage:{type(t).__name__}", f"{type(t).__name__} tensors without storage", exc)
            return
        except Exception as exc:  # noqa: BLE001 - a user subclass may raise anything; count the rest
            self._note(f"tensor:{type(t).__name__}", f"a {type(t).__name__} could not be measured", exc)
            return
        self._add(storages, category, name, module)

    def claim_storage(self, s: Any, name: str) -> None:
        """Count a storage held without a tensor (``UntypedStorage``/``TypedStorage``), category ``other``."""
        if id(s) in self._seen:  # self._first(s), inlined
            return
        self._seen.add(id(s))
        self._keep.append(s)
        self._final = None
        try:
            if scan.storage_key(s) in self._records:  # most are the storage of a tensor counted already
                return
            storages = scan.storage_storages(s)
        except Exception as exc:  # noqa: BLE001 - an odd storage must not stop the census
            self._note(f"storage:{type(s).__name__}", f"a {type(s).__name__} could not be measured", exc)
            return
        self._add(storages, "other", name, None)

    def claim_array(self, a: np.ndarray, name: str) -> None:
        """Count a numpy array's base buffer as host memory, category ``other``."""
        if not self._first(a):
            return
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
        self._add([st], "other", name, None, numpy=True)

    def records(self) -> list[TensorRecord]:
        """All records so far, each byte once.

        A block that overlaps blocks claimed before it keeps only the bytes they do not
        cover (claims come in priority order); one covered entirely is dropped. Then the
        blocks over foreign memory (``torch.from_numpy``, ``frombuffer``, DLPack, mmap)
        whose owner was not found are summed in :attr:`blind_spots`.
        """
        if self._final is None:
            items = list(self._records.items())
            self._final = _resolve_overlaps(items) if _any_overlap(items) else [rec for _, rec in items]
            self._foreign_blind_spot()
        return list(self._final)

    def _foreign_blind_spot(self) -> None:
        self.blind_spots.pop(FOREIGN_OWNER, None)
        if not self._foreign:
            return
        owners = sorted((key[1], key[1] + key[2]) for key in self._numpy_keys)
        starts = [lo for lo, _ in owners]
        orphans = [key for key in self._foreign if not _inside(key[1], key[1] + key[2], owners, starts)]
        if orphans:
            self.blind_spots[FOREIGN_OWNER] = sum(key[2] for key in orphans)
            self._note("foreign", f"{len(orphans)} tensors over memory torch did not allocate (torch.from_numpy, "
                                  "frombuffer, DLPack, mmap) whose owner no scan found: the bytes they span are "
                                  f"counted ({FOREIGN_OWNER}); an owner larger than that span (an array a "
                                  "tensor views part of) holds more, which no scan can see", warn=False)

    def bytes_on(self, device: str) -> int:
        """Census bytes on one device (for the unattributed reading)."""
        return sum(r.bytes for r in self.records() if r.device == device)


def _any_overlap(items: list[tuple[_Key, TensorRecord]]) -> bool:
    by_device: dict[str, list[tuple[int, int]]] = {}
    for (device, address, nbytes), _ in items:
        by_device.setdefault(device, []).append((address, address + nbytes))
    for spans in by_device.values():
        spans.sort()
        end = -1
        for lo, hi in spans:
            if lo < end:
                return True
            end = max(end, hi)
    return False


def _resolve_overlaps(items: list[tuple[_Key, TensorRecord]]) -> list[TensorRecord]:
    """In claim order, each block keeps the bytes no earlier block covered."""
    covered: dict[str, list[list[int]]] = {}  # device -> sorted disjoint [lo, hi) spans
    out = []
    for (device, lo, nbytes), rec in items:
        spans = covered.setdefault(device, [])
        hi = lo + nbytes
        fresh = nbytes - _overlap(lo, hi, spans)
        _insert(spans, lo, hi)
        if fresh <= 0:
            continue
        out.append(rec if fresh == rec.bytes else dataclasses.replace(rec, bytes=fresh))
    return out


def _overlap(lo: int, hi: int, spans: list[list[int]]) -> int:
    i = max(bisect.bisect_right(spans, [lo, float("inf")]) - 1, 0)
    total = 0
    while i < len(spans) and spans[i][0] < hi:
        total += max(0, min(spans[i][1], hi) - max(spans[i][0], lo))
        i += 1
    return total


def _insert(spans: list[list[int]], lo: int, hi: int) -> None:
    """Add ``[lo, hi)`` to sorted disjoint spans, merging what it touches."""
    i = bisect.bisect_left(spans, [lo, lo])
    if i > 0 and spans[i - 1][1] >= lo:
        i -= 1
    j = i
    while j < len(spans) and spans[j][0] <= hi:
        lo, hi = min(lo, spans[j][0]), max(hi, spans[j][1])
        j += 1
    spans[i:j] = [[lo, hi]]


def _inside(lo: int, hi: int, owners: list[tuple[int, int]], starts: list[int]) -> bool:
    """Whether ``[lo, hi)`` lies within one of the owner spans (sorted by start)."""
    return any(end >= hi for _, end in owners[: bisect.bisect_right(starts, lo)])
