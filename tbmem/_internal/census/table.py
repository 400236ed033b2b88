"""A census's records, kept as columns and made into :class:`TensorRecord` objects only when asked for.

A process with 100k small tensors has 100k storages: one record object each would cost the census
more than finding them (about 1.3 us and 300 bytes a record, and the user's next collections would
traverse them all). The plain tensors the census measures in bulk (:meth:`Ledger.claim_plain
<tbmem._internal.census.categorize.Ledger.claim_plain>`) are kept here as a :class:`Block` of numpy columns;
the totals are summed over the columns, and :class:`Records`, the ``Census.records`` sequence,
makes the records in order, largest first, as they are read.

Example:
    >>> from tbmem._internal.census.table import Records
    >>> from tbmem._internal.census.report import TensorRecord
    >>> small = TensorRecord("b", "other", (1,), "float32", "cpu", 4)
    >>> big = TensorRecord("a", "other", (4,), "float32", "cpu", 16)
    >>> records = Records([small, big], [0, 1], [])
    >>> [r.name for r in records], len(records)
    (['a', 'b'], 2)
"""

from __future__ import annotations

import ctypes
import mmap
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence, overload

import numpy as np

__all__ = ["TensorRecord", "Block", "Records", "give_back_heap", "TRIM_AFTER"]

#: A census of this many storages or more made temporaries of several MB (arrays, lists): glibc keeps the
#: heap they grew by (its mmap threshold rises after the first large free), so they are given back.
TRIM_AFTER = 20_000
_trim: Any = False


def give_back_heap() -> None:
    """``malloc_trim(0)`` where glibc offers it (a fraction of a millisecond): the freed temporaries go back
    to the system instead of staying in the process's resident memory."""
    global _trim
    if _trim is False:
        try:
            _trim = ctypes.CDLL(None).malloc_trim
        except (OSError, AttributeError):
            _trim = None
    if _trim is not None:
        _trim(0)


@dataclass(frozen=True)
class TensorRecord:
    """One storage, counted once, named after the first (highest-priority) tensor that uses it.

    Attributes:
        name: ``encoder.conv1.weight``, ``encoder.conv1.weight.grad``,
            ``optimizer.state[encoder.conv1.weight].exp_avg``, ``MmBackward0.saved_self``,
            ``numpy <function>:<variable>``, what holds an otherwise unnamed tensor
            (``trainer.val_batch['x']``, ``cache[3]``), or its type name.
        category: One of :data:`tbmem._internal.census.CATEGORIES`.
        shape: Shape of the tensor that named it (a view may be smaller than its storage).
        dtype: ``float32``, ``int64``, ... (numpy arrays: numpy's dtype name).
        device: ``cpu``, ``cuda:0``, ...
        bytes: Bytes of the whole storage.
        module: ``model.encoder`` for tensors of a watched model's top-level submodule, else None.
    """

    name: str
    category: str
    shape: tuple[int, ...]
    dtype: str
    device: str
    bytes: int
    module: str | None = None


_new = object.__new__


def make_record(name: str, category: str, shape: tuple[int, ...], dtype: str, device: str, nbytes: int,
                module: str | None) -> TensorRecord:
    """``TensorRecord(...)``, equal in every way, at less than half the cost: a frozen dataclass's
    ``__init__`` sets each field through ``object.__setattr__``."""
    rec = _new(TensorRecord)
    rec.__dict__.update(name=name, category=category, shape=shape, dtype=dtype, device=device, bytes=nbytes,
                        module=module)
    return rec


_PACK_AT_LEAST = 256 << 10  # glibc serves smaller blocks from its heap whatever is done here


def _packed(arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Copies of ``arrays`` in one anonymous memory map (the arrays themselves where they are small)."""
    sizes = [-(-a.nbytes // 8) * 8 for a in arrays]
    if sum(sizes) < _PACK_AT_LEAST:
        return arrays
    space = mmap.mmap(-1, sum(sizes))
    out, offset = [], 0
    for a, size in zip(arrays, sizes):
        view = np.frombuffer(space, dtype=a.dtype, count=a.size, offset=offset).reshape(a.shape)
        view[...] = a
        out.append(view)
        offset += size
    return out


@dataclass
class Block:
    """Records of one category as columns: row ``i`` is ``names[name[i]]``, ``shapes[shape[i]]``, ...

    ``start`` is the claim position of row 0 (rows follow in claim order): among records of equal
    size, the one claimed first comes first, as in a stable sort of record objects.

    Example:
        >>> import numpy as np
        >>> zeros = np.zeros(2, dtype=np.int32)
        >>> block = Block(0, "other", None, np.array([64, 4]), zeros, ["Tensor"], np.array([0, 1]), [(16,), (1,)],
        ...               zeros, ["float32"], zeros, ["cpu"])
        >>> block.record(1).shape, block.sums("device")
        ((1,), {'cpu': 68})
    """

    start: int
    category: str
    address: np.ndarray | None  # int64: where each storage's memory starts (dropped once the census is done)
    nbytes: np.ndarray  # int64
    name: np.ndarray  # int32 indices into names
    names: list[str]
    shape: np.ndarray
    shapes: list[tuple[int, ...]]
    dtype: np.ndarray
    dtypes: list[str]
    device: np.ndarray
    devices: list[str]
    module: str | None = None

    def __len__(self) -> int:
        return len(self.nbytes)

    def record(self, i: int) -> TensorRecord:
        """Row ``i`` as a record."""
        return make_record(self.names[self.name[i]], self.category, self.shapes[self.shape[i]],
                           self.dtypes[self.dtype[i]], self.devices[self.device[i]], int(self.nbytes[i]), self.module)

    def keep(self, rows: np.ndarray) -> "Block":
        """A block of only ``rows`` (a boolean mask), claim positions kept (see :attr:`positions`)."""
        address = None if self.address is None else self.address[rows]
        out = Block(self.start, self.category, address, self.nbytes[rows], self.name[rows], self.names,
                    self.shape[rows], self.shapes, self.dtype[rows], self.dtypes, self.device[rows], self.devices,
                    self.module)
        out.positions = self.positions[rows]
        return out

    @property
    def positions(self) -> np.ndarray:
        """Claim position of each row."""
        return self.__dict__.get("_positions", np.arange(self.start, self.start + len(self), dtype=np.int64))

    @positions.setter
    def positions(self, value: np.ndarray) -> None:
        self.__dict__["_positions"] = value

    def sums(self, column: str) -> dict[str, int]:
        """Bytes per value of ``column`` (``"dtype"``, ``"device"``; kept once :meth:`Records.freeze` summed them)."""
        known = self.__dict__.get("_sums", {}).get(column)
        if known is not None:
            return known
        labels: list[str] = getattr(self, column + "s")
        index = getattr(self, column)
        return {label: total for i, label in enumerate(labels) if (total := int(self.nbytes[index == i].sum()))}


@dataclass(eq=False)
class Records(Sequence[TensorRecord]):
    """``Census.records``: every record, largest first (equal sizes in claim order), made when read.

    Example:
        >>> records = Records([TensorRecord("w", "parameters", (2,), "float32", "cpu", 8)], [0], [])
        >>> len(records), records[0].name, records == [records[0]]
        (1, 'w', True)
    """

    named: list[TensorRecord]
    positions: list[int]
    blocks: list[Block]
    _order: np.ndarray | None = field(default=None, repr=False)
    _all: list[TensorRecord] | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.named) + sum(len(b) for b in self.blocks)

    def order(self) -> np.ndarray:
        """Row numbers, largest first: named records are rows ``0..len(named)``, then each block's rows."""
        if self._order is None:
            sizes = np.concatenate([np.fromiter((r.bytes for r in self.named), np.int64, len(self.named)),
                                    *(b.nbytes for b in self.blocks)])
            places = np.concatenate([np.asarray(self.positions, dtype=np.int64), *(b.positions for b in self.blocks)])
            self._order = np.lexsort((places, -sizes))
        return self._order

    def _record(self, row: int) -> TensorRecord:
        if row < len(self.named):
            return self.named[row]
        row -= len(self.named)
        for block in self.blocks:
            if row < len(block):
                return block.record(row)
            row -= len(block)
        raise IndexError(row)

    @overload
    def __getitem__(self, i: int) -> TensorRecord: ...

    @overload
    def __getitem__(self, i: slice) -> list[TensorRecord]: ...

    def __getitem__(self, i: int | slice) -> Any:
        if self._all is not None:
            return self._all[i]
        if not self.blocks:
            self._all = [self.named[k] for k in self.order()]
            return self._all[i]
        if isinstance(i, slice):
            return [self._record(int(row)) for row in self.order()[i]]
        return self._record(int(self.order()[i]))

    def __iter__(self) -> Iterator[TensorRecord]:
        if self._all is None:
            self._all = list(map(self._record, map(int, self.order())))
        return iter(self._all)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def freeze(self) -> "Records":
        """These records as the census hands them out: their order computed, and the columns (with that
        order) moved into one anonymous memory map when they are large, so that the memory goes back to
        the system as soon as the census is dropped (a block of this size taken from the C heap would
        stay in the process's resident memory after it was freed)."""
        order = self.order()
        columns = [order] + [c for b in self.blocks for c in (b.nbytes, b.name, b.shape, b.dtype, b.device)]
        packed = iter(_packed(columns))
        self._order = next(packed)
        blocks = []
        for b in self.blocks:
            nbytes, name, shape, dtype, device = (next(packed) for _ in range(5))
            block = Block(b.start, b.category, None, nbytes, name, b.names, shape, b.shapes, dtype, b.dtypes,
                          device, b.devices, b.module)
            block.__dict__["_sums"] = {column: b.sums(column) for column in ("dtype", "device")}  # summed now, not
            blocks.append(block)  # after the census gave its temporaries back to the system
        self.blocks = blocks
        return self

    def at_least(self, nbytes: int) -> list[TensorRecord]:
        """The records of ``nbytes`` or more, largest first."""
        out = []
        for row in self.order():
            rec = self._record(int(row))
            if rec.bytes < nbytes:
                break
            out.append(rec)
        return out
