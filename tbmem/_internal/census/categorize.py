"""The ledger: claims memory for categories in priority order, each byte once.

Example:
    >>> import torch
    >>> from tbmem._internal.census.categorize import Ledger
    >>> w = torch.zeros(10, 10)
    >>> ledger = Ledger()
    >>> ledger.claim(w, "parameters", "w")
    >>> ledger.claim(w.t(), "other", "w.T")  # a view: same storage, already counted
    >>> [(r.name, r.category, r.bytes) for r in ledger.records()]
    [('w', 'parameters', 400)]
"""

from __future__ import annotations

import operator
from itertools import compress
from typing import Any

import numpy as np
import torch

from tbmem._internal._log import report_once
from tbmem._internal.census import facts, heap, scan
from tbmem._internal.census.bulk import measure_plain, unknown_storages
from tbmem._internal.census.facts import TensorFacts
from tbmem._internal.census.spans import foreign_orphans, overlapping, resolve_overlaps
from tbmem._internal.census.table import Block, Records, TensorRecord, make_record

__all__ = ["Ledger", "FOREIGN_OWNER", "BULK_AT_LEAST"]

#: Blind spot: bytes of tensors over memory torch did not allocate whose owner no scan found.
FOREIGN_OWNER = "foreign_memory_owner_not_found"

_Key = tuple[str, int, int]  # (device, address, nbytes)
#: Plain tensors in a phase from which on they are measured as columns (:mod:`tbmem._internal.census.bulk`).
BULK_AT_LEAST = 64
_DICT_AT_MOST = 20_000  # tensors whose rows are found through a dict; more, through sorted ids


class Ledger:
    """Memory block -> record; the first claim of a byte wins.

    Claims must come in category priority order (parameters first, other last):
    that makes "memory counts in its highest-priority category" a first-come rule.
    Blocks are identified by device, address and size; blocks that overlap without
    being the same (two ``from_numpy`` tensors over parts of one array, an array and
    a tensor over its first half) are resolved byte by byte in :meth:`table`.
    Failures to measure one tensor are reported once per kind and noted; the
    census goes on. Plain tensors claimed in bulk (:meth:`claim_plain`) are kept as
    columns (:class:`tbmem._internal.census.table.Block`), not as record objects.

    Args:
        ttypes: The tensor types of this census (to recognise ``tensor.numpy()`` arrays).
    """

    def __init__(self, ttypes: set[type] | frozenset[type] | None = None) -> None:
        self.ttypes = ttypes if ttypes is not None else heap.tensor_types()
        self._records: dict[_Key, TensorRecord] = {}
        self._position: dict[_Key, int] = {}  # claim order of each record
        self._blocks: list[Block] = []
        self._block_tensors: list[list[Any]] = []  # the tensor naming each block row, until the census ends
        self._claims = 0
        self._seen: set[int] = set()
        self._keep: list[Any] = []  # holds claimed objects so their ids stay unique
        self._numpy_keys: set[_Key] = set()
        self._foreign: set[_Key] = set()
        self._namers: dict[_Key, Any] = {}  # tensors that named an "other" record after their type
        self._ids = np.zeros(0, dtype=np.int64)  # sorted ids of the tensors whose facts were read at the start,
        self._rows_by_id = np.zeros(0, dtype=np.int64)  # and their rows (numpy: no int object per tensor)
        self._facts: TensorFacts | None = None
        self._row_of: dict[int, int] | None = None
        self._final: Records | None = None
        self.notes: list[str] = []
        #: Named limitations -> bytes they concern (see :attr:`tbmem.Census.blind_spots`).
        self.blind_spots: dict[str, int] = {}
        #: Named limitations -> the plain sentence that explains them (with their bytes).
        self.blind_spot_notes: dict[str, str] = {}

    def use_facts(self, tensors: list[Any], got: TensorFacts) -> None:
        """Measure these tensors from their facts, read already (row ``i``: ``tensors[i]``), when claimed."""
        ids = got.rows[:, 6]  # id(tensors[i])
        if len(ids) <= _DICT_AT_MOST:  # a dict of a few thousand ints: faster to look up, and small
            self._row_of = dict(zip(ids.tolist(), range(len(ids))))
        else:  # sorted ids: no int object per tensor
            self._rows_by_id = np.argsort(ids)
            self._ids = ids[self._rows_by_id]
        self._facts = got

    def _storages(self, t: Any) -> list[scan.Storage]:
        facts_read = self._facts
        if facts_read is None:
            return scan.tensor_storages(t)
        if self._row_of is not None:
            i = self._row_of.get(id(t))
        else:
            at = int(np.searchsorted(self._ids, id(t)))
            i = int(self._rows_by_id[at]) if at < len(self._ids) and int(self._ids[at]) == id(t) else None
        if i is None:
            return scan.tensor_storages(t)
        return scan.storages_from_facts(t, facts_read.rows[i].tolist(), facts_read.dtypes, facts_read.shapes)

    def count(self) -> int:
        """Records so far (each storage counted once)."""
        return len(self._records) + sum(len(b) for b in self._blocks)

    def seen(self, obj: Any) -> bool:
        """Whether this very object was claimed already (cheap skip before measuring)."""
        return id(obj) in self._seen

    def _note(self, key: str, message: str, exc: BaseException | None = None, *, warn: bool = True) -> None:
        """Add a note to the census; a failure (``warn``) is also logged, once per key."""
        if warn and report_once(f"census:{key}", f"tbmem census: {message}", exc=exc):
            self.notes.append(message)
        elif message not in self.notes and len(self.notes) < 20:
            self.notes.append(message)

    def blind_spot(self, name: str, nbytes: int, sentence: str) -> None:
        """Name a limitation met by this census, the bytes it concerns and one plain sentence about it."""
        self.blind_spots[name] = nbytes
        self.blind_spot_notes[name] = sentence

    def _first(self, obj: Any) -> bool:
        if id(obj) in self._seen:
            return False
        self._seen.add(id(obj))
        self._keep.append(obj)
        self._final = None
        return True

    def has(self, key: _Key) -> bool:
        """Whether the memory block ``key`` was claimed already."""
        if key in self._records:
            return True
        where, address, nbytes = key
        return any(where in b.devices and bool(np.any((b.address == address) & (b.nbytes == nbytes)
                                                      & (b.device == b.devices.index(where))))
                   for b in self._blocks)

    def _add(self, storages: list[scan.Storage], category: str, name: str, module: str | None,
             numpy: bool = False, namer: Any = None, position: int | None = None) -> None:
        for (where, address), nbytes, dtype, device, shape, foreign in storages:  # scan.Storage's fields
            key = (where, address, nbytes)
            if key in self._records or (self._blocks and self.has(key)):
                continue
            self._records[key] = make_record(name, category, shape, dtype, device, nbytes, module)
            if position is None:
                self._position[key] = self._claims
                self._claims += 1
            else:
                self._position[key] = position
            if numpy:
                self._numpy_keys.add(key)
            elif foreign:
                self._foreign.add(key)
            if namer is not None:
                self._namers[key] = namer

    def claim(self, t: torch.Tensor, category: str, name: str, module: str | None = None, *,
              position: int | None = None) -> None:
        """Count the storages of ``t`` under ``category`` unless counted already (``position``: its place in
        claim order, given by :meth:`claim_plain` for the tensors it leaves to this)."""
        if id(t) in self._seen:  # self._first(t), inlined: a hundred claims per census
            return
        self._seen.add(id(t))
        self._keep.append(t)
        self._final = None
        try:
            storages = self._storages(t)
        except scan.NoStorageError as exc:
            self._note(f"nostorage:{type(t).__name__}", f"{type(t).__name__} tensors without storage", exc)
            return
        except Exception as exc:  # noqa: BLE001 - a user subclass may raise anything; count the rest
            self._note(f"tensor:{type(t).__name__}", f"a {type(t).__name__} could not be measured", exc)
            return
        namer = t if category == "other" and name == type(t).__name__ else None
        self._add(storages, category, name, module, namer=namer, position=position)

    def claim_plain(self, tensors: list[Any], category: str, got: TensorFacts | None = None) -> list[tuple[int, Any]]:
        """Claim many plain tensors (``type(t) is torch.Tensor``) at once, as columns.

        The common tensor (a storage torch allocated, strided, not nested) is measured in bulk
        (:func:`tbmem._internal.census.bulk.measure_plain`); the tensors already claimed are skipped, and
        each storage is counted once, named after the tensor's type. ``got``: their facts, if read
        already (row ``i``: ``tensors[i]``). Returns ``(position, tensor)`` of those that need
        :meth:`claim` one by one, at that place in claim order.
        """
        if got is not None:  # the ids are in the facts: no int object per tensor
            fresh_mask = ~np.isin(got.rows[:, 6], np.fromiter(self._seen, dtype=np.int64, count=len(self._seen)))
        else:
            fresh_mask = np.fromiter(map(operator.not_, map(self._seen.__contains__, map(id, tensors))), dtype=bool,
                                     count=len(tensors))
        fresh = list(compress(tensors, fresh_mask.tolist()))
        start = self._claims
        self._claims += len(fresh)
        if not fresh:
            return []
        self._final = None
        try:
            got = facts.tensor_facts(fresh) if got is None else got._replace(rows=got.rows[fresh_mask])
            if got is not None and len(fresh) < BULK_AT_LEAST:  # numpy's calls cost more than a few rows
                self._claim_rows(fresh, got, start, category)
                return []
            measured = None if got is None else measure_plain(fresh, got, list(self._records), self._blocks, start,
                                                              category)
        except Exception as exc:  # noqa: BLE001 - one by one then: slower, the same result
            self._note("bulk", "the plain tensors could not be measured together (measured one by one)", exc)
            measured = None
        if measured is None:
            return list(zip(range(start, start + len(fresh)), fresh))
        block, namers, rest = measured
        if len(block):
            self._blocks.append(block)
            self._block_tensors.append(namers)
        return rest

    def _claim_rows(self, tensors: list[Any], got: TensorFacts, start: int, category: str) -> None:
        """:meth:`claim` for each tensor, measured from its row of facts (read already)."""
        for i, (t, row) in enumerate(zip(tensors, got.rows.tolist())):
            self._seen.add(id(t))
            self._keep.append(t)
            name = type(t).__name__
            try:
                storages = scan.storages_from_facts(t, row, got.dtypes, got.shapes)
            except scan.NoStorageError as exc:
                self._note(f"nostorage:{name}", f"{name} tensors without storage", exc)
                continue
            except Exception as exc:  # noqa: BLE001 - count the rest
                self._note(f"tensor:{name}", f"a {name} could not be measured", exc)
                continue
            self._add(storages, category, name, None, namer=t if category == "other" else None, position=start + i)

    def claim_storages(self, storages: list[Any]) -> None:
        """:meth:`claim_storage` for each, named after its type; those of tensors counted already are skipped
        together (a process that asked 100k tensors for their storage holds 100k storage objects)."""
        fresh = [s for s in storages if id(s) not in self._seen]
        try:
            unknown = unknown_storages(fresh, list(self._records), self._blocks)
        except Exception as exc:  # noqa: BLE001 - one by one then: slower, the same result
            self._note("bulk-storages", "the storage objects could not be measured together", exc)
            unknown = None
        for s in fresh if unknown is None else unknown:
            self.claim_storage(s, type(s).__name__)

    def claim_storage(self, s: Any, name: str) -> None:
        """Count a storage held without a tensor (``UntypedStorage``/``TypedStorage``), category ``other``."""
        if id(s) in self._seen:  # self._first(s), inlined
            return
        self._seen.add(id(s))
        self._keep.append(s)
        self._final = None
        try:
            key = scan.storage_key(s)
            if key[1] == 0 or self.has(key):  # no data (a wrapper's placeholder), or a tensor's, counted already
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

    def unnamed(self, n: int) -> list[tuple[int, Any, Any]]:
        """The ``n`` largest records named only after their tensor's type: ``(bytes, tensor, handle)``."""
        rows: list[tuple[int, Any, Any]] = [(self._records[k].bytes, t, k) for k, t in self._namers.items()
                                            if k in self._records]
        for b, (block, tensors) in enumerate(zip(self._blocks, self._block_tensors)):
            if not tensors:
                continue
            top = np.argpartition(-block.nbytes, n)[:n] if len(block) > n else np.arange(len(block))
            rows += [(int(block.nbytes[i]), tensors[i], (b, int(i))) for i in top.tolist()]
        rows.sort(key=lambda row: -row[0])
        return rows[:n]

    def rename(self, handle: Any, name: str) -> None:
        """Give the record of ``handle`` (from :meth:`unnamed`) a better name."""
        self._final = None
        if isinstance(handle, tuple) and len(handle) == 2:
            block = self._blocks[handle[0]]
            if name not in block.names:
                block.names.append(name)
            block.name[handle[1]] = block.names.index(name)
            return
        rec = self._records[handle]
        self._records[handle] = make_record(name, rec.category, rec.shape, rec.dtype, rec.device, rec.bytes, rec.module)

    def release(self) -> None:
        """Let go of the objects held while the census ran (the records stay)."""
        self._ids = self._rows_by_id = np.zeros(0, dtype=np.int64)
        self._facts, self._row_of = None, None
        self._keep.clear()
        self._namers.clear()
        self._block_tensors = [[] for _ in self._blocks]

    def table(self) -> Records:
        """All records so far, each byte once, largest first.

        A block that overlaps blocks claimed before it keeps only the bytes they do not
        cover (claims come in priority order); one covered entirely is dropped. Then the
        blocks over foreign memory (``torch.from_numpy``, ``frombuffer``, DLPack, mmap)
        whose owner was not found are summed in :attr:`blind_spots`.
        """
        if self._final is None:
            named = list(self._records.items())
            involved, block_rows = overlapping(named, self._blocks)
            blocks = list(self._blocks)
            if involved or any(rows.any() for rows in block_rows):
                items = [(self._position[k], k, r) for k, r in named if k in involved]
                for b, rows in enumerate(block_rows):
                    for i in np.flatnonzero(rows):
                        block = blocks[b]
                        assert block.address is not None  # overlapping() found rows by these addresses
                        key = (block.devices[block.device[i]], int(block.address[i]), int(block.nbytes[i]))
                        items.append((int(block.positions[i]), key, block.record(int(i))))
                    blocks[b] = blocks[b].keep(~rows)
                resolved = resolve_overlaps(sorted(items, key=lambda item: item[0]))
                named = [(k, r) for k, r in named if k not in involved]
                positions = [self._position[k] for k, _ in named] + [p for p, _, _ in resolved]
                named_records = [r for _, r in named] + [r for _, _, r in resolved]
            else:
                positions = [self._position[k] for k, _ in named]
                named_records = [r for _, r in named]
            self._final = Records(named_records, positions, [b for b in blocks if len(b)])
            self._foreign_blind_spot()
            self._final.freeze()
        return self._final

    def records(self) -> list[TensorRecord]:
        """:meth:`table` as a list."""
        return list(self.table())

    def _foreign_blind_spot(self) -> None:
        self.blind_spots.pop(FOREIGN_OWNER, None)
        self.blind_spot_notes.pop(FOREIGN_OWNER, None)
        if not self._foreign:
            return
        owners = [k for k in self._records if k not in self._foreign]
        count, nbytes = foreign_orphans(sorted(self._foreign), owners, self._blocks)
        if count:
            many = count > 1
            self.blind_spot(FOREIGN_OWNER, nbytes, (
                f"{nbytes / 2**20:.2f} MB in {count} tensor{'s' if many else ''} over memory torch did not allocate "
                f"(torch.from_numpy, frombuffer, DLPack) {'are' if many else 'is'} in the table, but what owns that "
                f"memory (an array, a buffer) was not found: any part of it outside the tensor{'s' if many else ''} "
                "is missing from the census"))

    def bytes_on(self, device: str) -> int:
        """Census bytes on one device (for the unattributed reading)."""
        records = self.table()
        total = sum(r.bytes for r in records.named if r.device == device)
        for b in records.blocks:
            if device in b.devices:
                total += int(b.nbytes[b.device == b.devices.index(device)].sum())
        return total
