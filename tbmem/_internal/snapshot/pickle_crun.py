"""The snapshot pickle reader's runs of trace events in C, one pass per event.

A torch trace event is a small dict pickled as ``EMPTY_DICT MEMOIZE MARK (key value)* SETITEMS``
whose keys, after the first event, are references to memoised strings: the same bytes in every
event of one :class:`Layout`, which the interpreter (:mod:`tbmem._internal.snapshot.pickle_stream`) learns
from the first events it builds. ``tbmem/_internal/snapshot/_pickle_run.c`` (part of an optional extension,
built by the install and into the wheels) parses each event of a learned layout, resolves its
references through the answers of :class:`CRunner`'s callbacks (cached there per memo object and
per distinct string or frames list), and writes its row and the memo entries the interpreter would
store; it stops before the first event it cannot account for, which the interpreter reads.
Without the extension (:data:`C_READER` False) :func:`tbmem._internal.snapshot.readers.read_snapshot` reads
pickles with the restricted Unpickler instead (:mod:`tbmem._internal.snapshot.safe_pickle`); the interpreter
alone (``read_pickle(c_reader=False)``) gives the same rows, frames, stacks and strings as with the
C runs, which tests/snapshot/test_pickle_scan_c.py checks on real, synthetic and damaged pickles.

Example:
    >>> from tbmem._internal.snapshot.pickle_rows import EventRows, Limits, Memo
    >>> runner = CRunner(Memo(), EventRows(Limits()), State()) if C_READER else None
    >>> runner is None or runner.run(b"", 0, []) == (0, 0, [])
    True
"""

from __future__ import annotations

import importlib
import re
from typing import Any, Sequence

import numpy as np

from tbmem._internal.snapshot.pickle_rows import ACTION_CODE, EventRows, Memo, StackRef

__all__ = ["CRunner", "C_READER", "Layout", "State", "c_parser_takes"]

try:  # the parser and runs in C, where the install could compile them (imported by name: typed Any either way)
    _C: Any = importlib.import_module("tbmem._internal.snapshot._creader")
except ImportError:  # pragma: no cover - no C compiler at install time
    _C = None
#: Whether the reader's runs of events are read in C (False: no C compiler when tbmem was installed).
C_READER = _C is not None
_CAP = 1 << 16  # events per call: the output arrays are reused, each run's rows copied out
_H = 0x68
_KIND = {"frames": 0, "addr": 1, "device_free": 1, "size": 2, "time_us": 3, "stream": 4, "action": 5,
         "user_metadata": 7, "pool_id": 8}


class Layout:
    """The keys of one kind of event, in file order, with the bytes of their memo references."""

    def __init__(self, keys: Sequence[str], key_refs: Sequence[bytes]) -> None:
        self.keys = list(keys)
        self.raw_refs = [bytes(r) for r in key_refs]
        if any(len(r) > 8 for r in self.raw_refs):
            raise ValueError("a key reference is at most 5 bytes (LONG_BINGET)")


def pack_layouts(layouts: Sequence[Layout]) -> bytes:
    """The layouts as the C parser reads them."""
    spec = bytearray((len(layouts),))
    names: list[str] = []
    for layout in layouts:
        spec.append(len(layout.keys))
        for key, ref in zip(layout.keys, layout.raw_refs):
            kind = _KIND.get(key, 6)
            gen = 0
            if kind >= 6:
                if key not in names:
                    names.append(key)
                gen = names.index(key)
            spec += bytes((kind, gen, len(ref))) + ref.ljust(8, b"\0")
    return bytes(spec)


def c_parser_takes(layouts: Sequence[Layout]) -> bool:
    """Whether the C parser is built and its fixed bounds hold these layouts (64 of 64 keys at most)."""
    return _C is not None and 0 < len(layouts) <= 64 and all(0 < len(x.keys) <= 64 for x in layouts) \
        and len({k for x in layouts for k in x.keys if _KIND.get(k, 6) >= 6}) <= 64


def _decode(raw: bytes) -> str:
    try:
        return raw.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


class State:
    """What the runs remember between calls: decoded strings, the references to stacks read before."""

    def __init__(self) -> None:
        self.strings: dict[Any, str] = {}
        self.stack_refs: list[StackRef] = []
        self.pool_tuples: dict[tuple[int, int], tuple[int, int]] = {}


_REFS = re.compile(rb"h.|j....", re.DOTALL)


def _new_stack(key: bytes, memo: Memo, base: int, rows: EventRows) -> int:
    """Stack id of the frame references ``key`` (-1 if one is not a frame dict stored before)."""
    fids = []
    for r in _REFS.findall(key):
        idx = r[1] if r[0] == _H else int.from_bytes(r[1:], "little")
        v = memo[idx] if idx < base else None
        if type(v) is not dict:
            return -1
        fids.append(rows.frame_id(v))
    return rows.intern_stack(tuple(fids))


class CRunner:
    """Reads runs of events into ``rows`` and ``memo`` with the C parser (see the module docstring)."""

    def __init__(self, memo: Memo, rows: EventRows, state: State) -> None:
        self.memo, self.rows, self.state = memo, rows, state
        # the callbacks go with each run (a runner holding them would make a cycle the collector cannot see)
        self._runner = _C.new_runner()
        self._n_layouts = -1
        self._spec = b""
        cols = (np.int8, np.int64, np.int64, np.int64, np.int32, np.int32, np.int64, np.int32)
        self._cols = tuple(np.empty(_CAP, dtype=t) for t in cols)
        self._entries = np.empty(0, dtype=np.int32)

    # --- what a memo object or a value means (each asked once; the C side caches the answer) ------
    def _action(self, slot: int) -> int:
        v = self.memo.objects[slot]
        return ACTION_CODE.get(v, 0) if type(v) is str else -1

    def _frames(self, slot: int) -> int:
        v = self.memo.objects[slot]
        return v.sid if type(v) is StackRef else self.rows.stack_id(v) if type(v) is list else -3

    def _meta(self, slot: int) -> int:
        v = self.memo.objects[slot]
        return (self.rows.string_id(v) if v else -1) if type(v) is str else -3

    def _stack(self, refs: bytes) -> int:
        return _new_stack(refs, self.memo, len(self.memo), self.rows)

    def _text(self, raw: bytes) -> str:
        cache = self.state.strings
        value = cache.get(raw)
        if value is None:
            if len(cache) > 100_000:
                cache.clear()
            value = cache[raw] = _decode(raw)
        return value

    def _string(self, raw: bytes) -> int:
        return self.memo.slot(self._text(raw))

    def _meta_inline(self, raw: bytes) -> int:
        text = self._text(raw)
        return self.rows.string_id(text) if text else -1

    def _pool_slot(self, pair: tuple[int, int]) -> int:
        """Memo slot of the tuple an inline ``pool_id`` stores (one object per value: tuples are immutable)."""
        cache = self.state.pool_tuples
        obj = cache.get(pair)
        if obj is None:
            obj = cache[pair] = pair
        return self.memo.slot(obj)

    def _pool_of(self, slot: int) -> int:
        v = self.memo.objects[slot]
        k = self.rows.pool_index(v) if type(v) is tuple else -1
        return k if k >= 0 else -3

    def _refslot(self, sid: int) -> int:
        refs = self.state.stack_refs
        refs.extend(StackRef(k) for k in range(len(refs), sid + 1))
        return self.memo.slot(refs[sid])

    # --- runs ---------------------------------------------------------------------------------------
    def forget(self) -> None:
        """A memo entry was overwritten: stacks cached by their reference bytes may be stale."""
        _C.forget(self._runner)

    def run(self, buf: bytes, pos: int, layouts: Sequence[Layout]) -> tuple[int, int, list[int]]:
        """Read the run of events at ``pos``: (events read, where the last one ends, the event
        indices within the run where a new batch of list items starts)."""
        if not layouts or not c_parser_takes(layouts):
            return 0, pos, []
        if len(layouts) != self._n_layouts:
            self._spec = pack_layouts(layouts)
            self._n_layouts = len(layouts)
            self._entries = np.empty(_CAP * (1 + max(len(x.keys) for x in layouts)), dtype=np.int32)
        memo = self.memo
        n, end, cuts, m = _C.run(self._runner, (self._action, self._frames, self._meta, self._stack, self._string,
                                                self._meta_inline, self._refslot, self._pool_slot, self._pool_of),
                                 buf, pos, len(buf), self._spec, memo._slots, len(memo), (*self._cols, self._entries))
        if n:
            action, addr, size, time, stack, meta, stream, pool = (c[:n].copy() for c in self._cols)
            memo.extend_slots(self._entries[:m])
            self.rows.add_block(action=action, addr=addr, size=size, time=time, stack=stack, meta=meta,
                                stream=stream, pool=pool)
        return n, end, cuts
