"""The snapshot pickle reader's runs of trace events in C: what :func:`~tbmem.snapshot.pickle_fast.scan`
and :func:`~tbmem.snapshot.pickle_commit.commit` do with numpy, in one pass per event.

``tbmem/snapshot/_pickle_run.c`` (part of an optional extension, built by the install where a C compiler is)
parses each event, resolves its references through the answers of :class:`CRunner`'s callbacks
(cached there per memo object and per distinct string or frames list), and writes its row and the
memo entries the interpreter would store; it stops before the first event it cannot account for,
which the general interpreter reads (:mod:`tbmem.snapshot.pickle_stream`). Without the extension
(:data:`C_READER` False) the reader uses the numpy path; both give the same rows, frames, stacks
and strings (tests/snapshot/test_pickle_scan_c.py).

Example:
    >>> from tbmem.snapshot.pickle_rows import EventRows, Limits, Memo
    >>> from tbmem.snapshot.pickle_commit import State
    >>> runner = CRunner(Memo(), EventRows(Limits()), State()) if C_READER else None
    >>> runner is None or runner.run(b"", 0, []) == (0, 0, [])
    True
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from tbmem.snapshot.pickle_commit import State, _decode, _new_stack
from tbmem.snapshot.pickle_fast import Layout, c_parser_takes, pack_layouts
from tbmem.snapshot.pickle_rows import ACTION_CODE, EventRows, Memo, StackRef

__all__ = ["CRunner", "C_READER"]

try:  # the parser and runs in C, where the install could compile them
    from tbmem.snapshot import _creader as _C
except ImportError:  # pragma: no cover - no C compiler at install time
    _C = None  # type: ignore[assignment]
#: Whether the reader's runs of events are read in C (False: no C compiler when tbmem was installed).
C_READER = _C is not None
_CAP = 1 << 16  # events per call: the output arrays are reused, each run's rows copied out


class CRunner:
    """Reads runs of events into ``rows`` and ``memo`` with the C parser (see the module docstring)."""

    def __init__(self, memo: Memo, rows: EventRows, state: State) -> None:
        self.memo, self.rows, self.state = memo, rows, state
        # the callbacks go with each run (a runner holding them would make a cycle the collector cannot see)
        self._runner = _C.new_runner()
        self._n_layouts = -1
        self._spec = b""
        cols = (np.int8, np.int64, np.int64, np.int64, np.int32, np.int32, np.int64)
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
            self._spec = pack_layouts(layouts)[0]
            self._n_layouts = len(layouts)
            self._entries = np.empty(_CAP * (1 + max(len(x.keys) for x in layouts)), dtype=np.int32)
        memo = self.memo
        n, end, cuts, m = _C.run(self._runner, (self._action, self._frames, self._meta, self._stack, self._string,
                                                self._meta_inline, self._refslot),
                                 buf, pos, len(buf), self._spec, memo._slots, len(memo), (*self._cols, self._entries))
        if n:
            action, addr, size, time, stack, meta, stream = (c[:n].copy() for c in self._cols)
            memo.extend_slots(self._entries[:m])
            self.rows.add_block(action=action, addr=addr, size=size, time=time, stack=stack, meta=meta,
                                stream=stream)
        return n, end, cuts
