"""Memory blocks as address spans: which overlap, what each keeps, and which foreign blocks have no owner.

The ledger identifies a block by ``(device, address, nbytes)``. Blocks that overlap without being the
same (two ``torch.from_numpy`` tensors over parts of one array) share bytes that must count once: in
claim order, each keeps the bytes no earlier block covered. Overlaps are found over every block at
once with numpy (a census of 100k storages has 100k spans); only the blocks that overlap another are
then resolved one by one.

Example:
    >>> from tbmem._internal.census.spans import merged_length
    >>> merged_length([(0, 100), (50, 120), (200, 210)])  # 120 + 10 bytes, each once
    130
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import Sequence

import numpy as np

from tbmem._internal.census.table import Block, TensorRecord

__all__ = ["overlapping", "resolve_overlaps", "foreign_orphans", "merged_length"]

_Key = tuple[str, int, int]


def _spans(keys: Sequence[_Key], blocks: Sequence[Block]) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]:
    """``(device code, lo, hi)`` of every named block then every block row, and where each block starts."""
    devices: dict[str, int] = {}
    dev = [devices.setdefault(k[0], len(devices)) for k in keys]
    lo = [k[1] for k in keys]
    hi = [k[1] + k[2] for k in keys]
    parts_dev, parts_lo, parts_hi = [np.asarray(dev, np.int64)], [np.asarray(lo, np.int64)], [np.asarray(hi, np.int64)]
    starts = []
    offset = len(keys)
    for b in blocks:
        if b.address is None:  # dropped once a census is done; these blocks are still being counted
            raise ValueError("a block without addresses has no spans")
        codes = np.asarray([devices.setdefault(name, len(devices)) for name in b.devices], np.int64)
        parts_dev.append(codes[b.device] if len(b) else np.zeros(0, np.int64))
        parts_lo.append(b.address.astype(np.int64))
        parts_hi.append(b.address.astype(np.int64) + b.nbytes)
        starts.append(offset)
        offset += len(b)
    return np.concatenate(parts_dev), np.concatenate(parts_lo), np.concatenate(parts_hi), starts


def overlapping(named: Sequence[tuple[_Key, TensorRecord]], blocks: Sequence[Block]) -> tuple[set[_Key], list[np.ndarray]]:
    """The named keys and the block rows (a mask per block) that overlap another block without being it."""
    keys = [k for k, _ in named]
    if not blocks and len(keys) < _NUMPY_AT_LEAST:  # a census's usual hundred blocks: faster without numpy
        return _overlapping_few(keys), []
    dev, lo, hi, starts = _spans(keys, blocks)
    involved = np.zeros(len(lo), dtype=bool)
    if len(lo) > 1:
        order = np.lexsort((lo, dev))
        d, l, h = dev[order], lo[order], hi[order]
        reach = np.empty_like(h)  # the highest end of the spans before, on the same device
        for code in np.flatnonzero(np.bincount(d)):
            where = np.flatnonzero(d == code)
            ends = np.maximum.accumulate(h[where])
            reach[where] = np.concatenate([[np.iinfo(np.int64).min], ends[:-1]])
        overlaps = l < reach  # starts before a previous span ends: same cluster as it
        if overlaps.any():
            cluster = np.cumsum(~overlaps)
            sizes = np.bincount(cluster)
            involved[order] = sizes[cluster] > 1
    named_involved = {keys[i] for i in np.flatnonzero(involved[:len(keys)])}
    rows = [involved[s:s + len(b)] for s, b in zip(starts, blocks)]
    return named_involved, rows


_NUMPY_AT_LEAST = 1000


def _overlapping_few(keys: list[_Key]) -> set[_Key]:
    """:func:`overlapping` for a few named keys, in Python."""
    involved: set[_Key] = set()
    by_device: dict[str, list[tuple[int, int, _Key]]] = {}
    for key in keys:
        by_device.setdefault(key[0], []).append((key[1], key[1] + key[2], key))
    for spans in by_device.values():
        spans.sort()
        reacher: _Key | None
        reach, reacher = -1, None
        for lo, hi, key in spans:
            if lo < reach and reacher is not None:  # reach > -1: some span set reacher
                involved.add(key)
                involved.add(reacher)
            if hi > reach:
                reach, reacher = hi, key
    return involved


def resolve_overlaps(items: list[tuple[int, _Key, TensorRecord]]) -> list[tuple[int, _Key, TensorRecord]]:
    """In claim order, each block keeps the bytes no earlier block covered; one covered entirely is dropped."""
    covered: dict[str, list[list[int]]] = {}  # device -> sorted disjoint [lo, hi) spans
    out = []
    for position, (device, lo, nbytes), rec in items:
        spans = covered.setdefault(device, [])
        hi = lo + nbytes
        fresh = nbytes - _overlap(lo, hi, spans)
        _insert(spans, lo, hi)
        if fresh <= 0:
            continue
        out.append((position, (device, lo, nbytes), rec if fresh == rec.bytes else dataclasses.replace(rec, bytes=fresh)))
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


def merged_length(spans: list[tuple[int, int]]) -> int:
    """Bytes covered by ``[lo, hi)`` spans, each byte once."""
    total, end = 0, None
    for lo, hi in sorted(spans):
        if end is None or lo >= end:
            total += hi - lo
            end = hi
        elif hi > end:
            total += hi - end
            end = hi
    return total


def foreign_orphans(foreign: Sequence[_Key], owners: Sequence[_Key], blocks: Sequence[Block]) -> tuple[int, int]:
    """How many foreign blocks lie inside no owner (an array, a storage that owns its memory, any block
    torch allocated), and the bytes they span, each byte once (overlapping tensors over one array)."""
    dev, lo, hi, _ = _spans(list(owners), blocks)
    names = {k[0] for k in owners} | {n for b in blocks for n in b.devices}
    code_of = {name: code for code, name in enumerate(_device_order(owners, blocks))}
    orphans: list[tuple[int, int]] = []
    by_device: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for where, address, nbytes in foreign:
        inside = False
        if where in names:
            code = code_of[where]
            if code not in by_device:
                mine = dev == code
                order = np.argsort(lo[mine], kind="stable")
                by_device[code] = (lo[mine][order], np.maximum.accumulate(hi[mine][order]))
            starts, reach = by_device[code]
            i = int(np.searchsorted(starts, address, side="right"))
            inside = i > 0 and int(reach[i - 1]) >= address + nbytes
        if not inside:
            orphans.append((address, address + nbytes))
    return len(orphans), merged_length(orphans)


def _device_order(owners: Sequence[_Key], blocks: Sequence[Block]) -> list[str]:
    """Device names in the order :func:`_spans` numbers them."""
    seen: dict[str, None] = {}
    for k in owners:
        seen.setdefault(k[0])
    for b in blocks:
        for name in b.devices:
            seen.setdefault(name)
    return list(seen)
