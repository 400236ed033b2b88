"""Measuring many plain tensors at once: a process with 100k small tensors, without 100k record objects.

:meth:`Ledger.claim_plain <tbmem._internal.census.categorize.Ledger.claim_plain>` hands the plain tensors
(``type(t) is torch.Tensor``) still unclaimed in the ``other`` phase to :func:`measure_plain`. Their
storages' facts are read in one call (:func:`tbmem._internal.census.scan.facts_array`), the common case (memory
a torch allocator made, strided, not nested) is deduplicated with numpy (a storage several tensors
view counts once, named by the first) and becomes a :class:`tbmem._internal.census.table.Block` of columns;
the others (memory torch did not allocate, nested or meta tensors, a symbolic size) are returned to
be claimed one by one, as before.

Example:
    >>> import torch
    >>> from tbmem._internal.census.bulk import measure_plain
    >>> from tbmem._internal.census.facts import tensor_facts
    >>> tensors = [base := torch.zeros(100), base[10:], torch.ones(3)]
    >>> block, namers, rest = measure_plain(tensors, tensor_facts(tensors), [], [], 0, "other")
    >>> block.nbytes.tolist(), len(rest)  # the view counts with its base, once
    ([400, 12], 0)
"""

from __future__ import annotations

from itertools import compress
from typing import Any, Sequence

import numpy as np

import torch

from tbmem._internal.census import facts, scan
from tbmem._internal.census.facts import TensorFacts
from tbmem._internal.census.table import Block

__all__ = ["measure_plain", "unknown_storages"]

_Key = tuple[str, int, int]
_storage_impl = vars(torch._C.StorageBase)["_cdata"].__get__  # the StorageImpl address, as torch gives it


def _distinct(values: np.ndarray) -> np.ndarray:
    """The distinct small non-negative ints among ``values``, sorted (``np.unique`` imports numpy.ma)."""
    if len(values) < 4096:
        return np.asarray(sorted(set(values.tolist())), dtype=np.int64)
    return np.flatnonzero(np.bincount(values))


def _among(values: np.ndarray, wanted: list[int]) -> np.ndarray:
    """``values`` (device codes, below 2**16) that are in ``wanted``, as a mask."""
    if not wanted:
        return np.zeros(len(values), dtype=bool)
    if len(wanted) == 1:
        return values == wanted[0]
    return np.isin(values, wanted)


def _first_of_each(data: np.ndarray, nbytes: np.ndarray, code: np.ndarray) -> np.ndarray:
    """Index of the first row of each distinct ``(data, nbytes, code)``, in row order."""
    _, first, inverse = np.unique(data, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    if len(first) == len(data) or ((nbytes == nbytes[first][inverse]).all() and (code == code[first][inverse]).all()):
        first.sort()
        return first
    order = np.lexsort((np.arange(len(data)), code, nbytes, data))  # one address, two sizes: both kept
    keys = np.stack([data[order], nbytes[order], code[order]], axis=1)
    new = np.ones(len(order), dtype=bool)
    new[1:] = (keys[1:] != keys[:-1]).any(axis=1)
    return np.sort(order[new])


def measure_plain(tensors: list[Any], got: TensorFacts, named: Sequence[_Key], blocks: Sequence[Block],
                  start: int, category: str) -> tuple[Block, list[Any], list[tuple[int, Any]]]:
    """The bulk-measurable ``tensors`` as a block (claim positions ``start + index``), the tensor naming
    each of its rows, and ``(position, tensor)`` of the rest. ``got`` holds their facts (row ``i``:
    ``tensors[i]``, :func:`tbmem._internal.census.facts.tensor_facts`). Storages in ``named`` or ``blocks`` are
    counted already.
    """
    rows = got.rows
    storage, data, nbytes, flags, shape = rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3], rows[:, 5]
    code = flags & 0xFFFF
    codes = _distinct(code)
    names = {int(c): facts.device_of(int(c)) for c in codes}
    measurable = _among(code, [c for c, n in names.items() if n is not None and n != "meta"])
    owned = (flags & (facts.RESIZABLE | facts.ALLOCATED) != 0) | ~_among(code, [c for c, n in names.items()
                                                                                if n == "cpu"])  # foreign: CPU only
    simple = (measurable & (storage != 0) & (data != 0) & (nbytes > 0) & owned & (flags & facts.NESTED == 0)
              & (shape >= 0))
    empty = _among(code, [c for c, n in names.items() if n == "meta"]) | (measurable & (storage != 0) & (
        nbytes == 0) & (flags & facts.NESTED == 0))  # meta tensors; freed storages (resize_(0)) and empty ones
    picked = np.flatnonzero(simple)
    rest = [(start + i, tensors[i]) for i in np.flatnonzero(~simple & ~empty).tolist()]
    p_data, p_nbytes, p_code = data[picked], nbytes[picked], code[picked]
    first = _first_of_each(p_data, p_nbytes, p_code)  # a storage several tensors look into: its first tensor
    if len(first) and (named or blocks):
        first = first[~_counted(p_data[first], p_nbytes[first], p_code[first], named, blocks, names)]
    rows_kept = picked[first]
    dtype_used = _distinct(rows[rows_kept, 4])
    block = Block(
        start, category, p_data[first].copy(), p_nbytes[first].copy(),
        np.zeros(len(first), dtype=np.int32), ["Tensor"],
        rows[rows_kept, 5].astype(np.int32), list(got.shapes),
        np.searchsorted(dtype_used, rows[rows_kept, 4]).astype(np.int32),
        [str(got.dtypes[d]).removeprefix("torch.") for d in dtype_used.tolist()],
        np.searchsorted(codes, p_code[first]).astype(np.int32),
        [names[int(c)] or "" for c in codes])
    block.positions = start + rows_kept
    chosen = np.zeros(len(tensors), dtype=bool)
    chosen[rows_kept] = True  # (rows_kept is sorted) a mask: no int object per tensor
    namers = list(compress(tensors, chosen.tolist()))
    return block, namers, rest


def _counted(data: np.ndarray, nbytes: np.ndarray, code: np.ndarray, named: Sequence[_Key], blocks: Sequence[Block],
             names: dict[int, str | None]) -> np.ndarray:
    """Which rows are storages counted already (in ``named`` or ``blocks``), as a mask."""
    code_of = {name: c for c, name in names.items() if name is not None}
    known: set[tuple[int, int, int]] = {(a, n, code_of[w]) for w, a, n in named if w in code_of}
    addresses = [np.fromiter((a for a, _, _ in known), dtype=np.int64, count=len(known))]
    for b in blocks:
        if b.address is None:  # dropped once a census is done; these blocks are still being counted
            raise ValueError("a block without addresses cannot be matched")
        mine = np.asarray([code_of.get(name, -1) for name in b.devices], dtype=np.int64)[b.device]
        keep = mine >= 0
        addresses.append(b.address[keep])
        known.update(zip(b.address[keep].tolist(), b.nbytes[keep].tolist(), mine[keep].tolist()))
    hits = np.flatnonzero(np.isin(data, np.concatenate(addresses)))  # few: checked one by one
    out = np.zeros(len(data), dtype=bool)
    out[hits] = [(a, n, c) in known for a, n, c in zip(data[hits].tolist(), nbytes[hits].tolist(),
                                                        code[hits].tolist())]
    return out


def unknown_storages(storages: list[Any], named: Sequence[_Key], blocks: Sequence[Block]) -> list[Any] | None:
    """The storage objects (``UntypedStorage``, ``TypedStorage``) whose memory is not counted yet and has
    data: most are the storage of a tensor counted already (torch keeps one for each storage some code
    asked for). None without torch's layout (see :func:`tbmem._internal._torch_private_census.storage_layout`)."""
    untyped = [s if type(s) is torch.UntypedStorage else scan.untyped_of(s) for s in storages]
    rows = facts.storage_facts(list(map(_storage_impl, untyped)))
    if rows is None:
        return None
    code = rows[:, 3] & 0xFFFF
    names = {int(c): facts.device_of(int(c)) for c in _distinct(code)}
    fresh = rows[:, 1] != 0
    if named or blocks:
        fresh &= ~_counted(rows[:, 1], rows[:, 2], code, named, blocks, names)
    return [storages[i] for i in np.flatnonzero(fresh).tolist()]
