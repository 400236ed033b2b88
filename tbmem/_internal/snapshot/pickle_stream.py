"""A streaming reader of snapshot pickles: plain data only, bounded memory, no code from the file.

``torch.cuda.memory._dump_snapshot`` writes one pickled dict whose ``device_traces``
hold one small dict per allocator event; a 1 GB pickle holds about ten million of
them, and unpickling it whole takes 5-6 GB of Python objects. This reader runs the
pickle opcodes itself (the plain-data subset: no ``GLOBAL``, ``REDUCE``, ``BUILD``
or persistent ids, refused as :class:`~tbmem._internal.snapshot.safe_pickle.UnsafePickleError`),
and turns trace events straight into rows of integer columns
(:class:`~tbmem._internal.snapshot.pickle_rows.EventRows`) instead of dicts: the layout of an
event's keys is learned from the first events the interpreter builds, then runs of
further events are read in C (:mod:`tbmem._internal.snapshot.pickle_crun`, where the extension was
built). Anything the C runs do not cover (a first occurrence of a frame, an ``oom`` event,
an unusual pickler) goes through the interpreter, so the result does not depend on the C
runs, only the speed does (the interpreter alone reads every event, about 50 times slower;
without the extension :func:`tbmem._internal.snapshot.readers.read_snapshot` uses the restricted
Unpickler instead). Protocol 4/5 FRAME headers are
removed while reading, so that no event straddles one.

Limits (:class:`~tbmem._internal.snapshot.pickle_rows.Limits`) bound what a file can make the
reader hold: string and integer sizes, container sizes, objects outside the trace
rows, events. A file over a limit, truncated or malformed is refused with
:class:`~tbmem._internal.snapshot.pickle_rows.SnapshotRefused`, which says why.

Example:
    >>> import io, pickle
    >>> from tbmem._internal.snapshot.pickle_stream import read_pickle
    >>> ev = {"action": "alloc", "addr": 64, "size": 512, "stream": 0, "time_us": 7, "frames": []}
    >>> top, rows = read_pickle(io.BytesIO(pickle.dumps({"segments": [], "device_traces": [[ev, dict(ev)]]})))
    >>> order = rows.rows_of(top["device_traces"][0])  # the trace's rows, in trace order
    >>> rows.column("size")[order].tolist(), rows.count
    ([512, 512], 2)
"""

from __future__ import annotations

import struct

from typing import Any, BinaryIO, Callable

from tbmem._internal.snapshot.pickle_crun import C_READER, CRunner, Layout, State
from tbmem._internal.snapshot.pickle_input import Input, ascii_text, text_int, utf8
from tbmem._internal.snapshot.pickle_rows import EVENT, ROW, EventRows, Limits, Memo, SnapshotRefused
from tbmem._internal.snapshot.safe_pickle import UnsafePickleError

__all__ = ["read_pickle"]


def _ref_bytes(idx: int) -> bytes:
    return b"h" + bytes((idx,)) if idx < 256 else b"j" + struct.pack("<I", idx)


# --- the general interpreter ----------------------------------------------------------------------
_MARGIN = 1 << 20
_REFUSED_OPS = {
    b"c"[0]: "GLOBAL", 0x93: "STACK_GLOBAL", b"R"[0]: "REDUCE", b"b"[0]: "BUILD", b"i"[0]: "INST",
    b"o"[0]: "OBJ", 0x81: "NEWOBJ", 0x92: "NEWOBJ_EX", b"P"[0]: "PERSID", b"Q"[0]: "BINPERSID",
    0x82: "EXT1", 0x83: "EXT2", 0x84: "EXT4", 0x97: "NEXT_BUFFER", 0x98: "READONLY_BUFFER",
}


class _Mark:
    __slots__ = ()


class _Machine(Input):
    def __init__(self, fh: BinaryIO, limits: Limits, progress: Callable[[int], None] | None,
                 c_reader: bool = True) -> None:
        super().__init__(fh, limits, progress)
        self.rows = EventRows(limits)
        self.memo = Memo()
        self.str_memo: dict[str, int] = {}
        self.layouts: list[Layout] = []
        self.layout_keys: set[tuple[str, ...]] = set()
        self.objects = 0
        self.crun = CRunner(self.memo, self.rows, State()) if C_READER and c_reader else None

    # --- memo ----------------------------------------------------------------------------------
    def _put(self, idx: int, value: Any) -> None:
        memo = self.memo
        if idx == len(memo):
            memo.append(value)
        elif idx < len(memo):
            memo[idx] = value
            if self.crun is not None:  # an overwritten entry: cached meanings of references may be stale
                self.crun.forget()
        else:
            if idx > len(memo) + 1_000_000:
                raise SnapshotRefused(f"memo index {idx} is far beyond the {len(memo)} objects stored so far")
            memo.extend([None] * (idx - len(memo)))
            memo.append(value)
        if type(value) is str and len(value) < 256 and value not in self.str_memo:
            self.str_memo[value] = idx

    def _get(self, idx: int) -> Any:
        try:
            value = self.memo[idx]
        except IndexError:
            raise SnapshotRefused(f"the pickle refers to memo entry {idx}, which it never stored") from None
        if value is EVENT:
            raise SnapshotRefused("the pickle refers twice to one trace event, which torch never writes")
        return value

    def _count(self, n: int = 1) -> None:
        self.objects += n
        if self.objects > self.limits.max_objects:
            raise SnapshotRefused(f"more than {self.limits.max_objects:,} objects outside the trace events "
                                  "(Limits.max_objects)")

    def _check_len(self, n: int, what: str) -> int:
        if n < 0 or n > self.limits.max_string_bytes:
            raise SnapshotRefused(f"a {what} of {n:,} bytes is over the limit of "
                                  f"{self.limits.max_string_bytes:,} (Limits.max_string_bytes)")
        return n

    # --- learning event layouts ---------------------------------------------------------------------
    def _learn(self, d: dict) -> None:
        keys = tuple(d)
        if keys in self.layout_keys or "action" not in d or "frames" not in d or len(self.layouts) >= 8:
            return
        if "size" not in d or ("addr" not in d and "device_free" not in d):
            return
        refs = []
        for k in keys:
            idx = self.str_memo.get(k) if isinstance(k, str) else None
            if idx is None or self.memo[idx] != k:
                return  # a key not stored once in the memo: learn from a later event
            refs.append(_ref_bytes(idx))
        self.layout_keys.add(keys)
        self.layouts.append(Layout(list(keys), refs))

    # --- the interpreter loop -----------------------------------------------------------------------
    def run(self) -> Any:  # noqa: C901 - one loop over the opcodes is the fast way to interpret them
        stack: list[Any] = []
        marks: list[int] = []
        take = self._take
        put = self._put
        limits = self.limits
        self._fill(2)
        if self.buf[self.pos] != 0x80:
            # protocol 0/1 pickles start with an opcode directly; nothing else is a pickle
            if self.buf[self.pos:self.pos + 1] not in (b"(", b"}", b"]", b"d", b"l", b"N", b"I", b"S", b"V"):
                raise SnapshotRefused("not a pickle (no PROTO opcode at the start)")
        while True:
            if len(self.buf) - self.pos < _MARGIN and not self.eof:
                self._fill(_MARGIN, strict=False)
            buf = self.buf
            pos = self.pos
            if pos >= len(buf):
                raise SnapshotRefused("the pickle is truncated (no STOP opcode)")
            op = buf[pos]
            if op == 0x7D and self.layouts and self._fast(buf, pos, stack, marks):
                continue  # EMPTY_DICT: the first of a run of trace events, now rows
            self.pos = pos + 1
            if op == 0x94:  # MEMOIZE
                if not stack:
                    raise SnapshotRefused("MEMOIZE with an empty stack")
                put(len(self.memo), stack[-1])
            elif op == 0x68:  # BINGET
                stack.append(self._get(take(1)[0]))
            elif op == 0x6A:  # LONG_BINGET
                stack.append(self._get(struct.unpack("<I", take(4))[0]))
            elif op == 0x28:  # MARK
                marks.append(len(stack))
                stack.append(_MARK)
            elif op == 0x7D:  # EMPTY_DICT
                self._count()
                stack.append({})
            elif op == 0x5D:  # EMPTY_LIST
                self._count()
                stack.append([])
            elif op == 0x4B:  # BININT1
                stack.append(take(1)[0])
            elif op == 0x4D:  # BININT2
                stack.append(struct.unpack("<H", take(2))[0])
            elif op == 0x4A:  # BININT
                stack.append(struct.unpack("<i", take(4))[0])
            elif op == 0x8A:  # LONG1
                n = take(1)[0]
                if n > limits.max_int_bytes:
                    raise SnapshotRefused(f"an integer of {n} bytes is over the limit of {limits.max_int_bytes} "
                                          "(Limits.max_int_bytes)")
                stack.append(int.from_bytes(take(n), "little", signed=True))
            elif op == 0x8C:  # SHORT_BINUNICODE
                self._count()
                stack.append(utf8(take(take(1)[0])))
            elif op == 0x58:  # BINUNICODE
                self._count()
                stack.append(utf8(take(self._check_len(struct.unpack("<I", take(4))[0], "string"))))
            elif op == 0x75 or op == 0x73 or op == 0x65 or op == 0x61:  # SETITEMS, SETITEM, APPENDS, APPEND
                if op == 0x75 or op == 0x65:
                    if not marks:
                        raise SnapshotRefused("SETITEMS/APPENDS without a MARK")
                    k = marks.pop()
                    items = stack[k + 1:]
                    del stack[k:]
                else:
                    if not stack:
                        raise SnapshotRefused("SETITEM/APPEND with an empty stack")
                    items = stack[-2:] if op == 0x73 else stack[-1:]
                    del stack[len(stack) - len(items):]
                if not stack:
                    raise SnapshotRefused("SETITEMS/APPENDS with nothing to add to")
                target = stack[-1]
                if op == 0x75 or op == 0x73:
                    if _ROW in items:
                        raise SnapshotRefused("an allocator event stored outside a device trace list")
                    if type(target) is not dict or len(items) % 2:
                        raise SnapshotRefused("SETITEMS on something that is not a dict")
                    if len(target) + len(items) // 2 > limits.max_container:
                        raise SnapshotRefused(f"a dict of more than {limits.max_container:,} items")
                    try:
                        for i in range(0, len(items), 2):
                            target[items[i]] = items[i + 1]
                    except TypeError as exc:
                        raise SnapshotRefused(f"a dict key is not hashable ({exc})") from None
                    if "action" in target and "frames" in target:
                        self._learn(target)
                else:
                    self._append(target, items)
            elif op == 0x95:  # FRAME: frames only group opcodes for buffering
                take(8)
            elif op == 0x88:
                stack.append(True)
            elif op == 0x89:
                stack.append(False)
            elif op == 0x4E:
                stack.append(None)
            elif op == 0x85 or op == 0x86 or op == 0x87:  # TUPLE1/2/3
                n = op - 0x84
                if len(stack) < n or any(x is _MARK or x is _ROW for x in stack[-n:]):
                    raise SnapshotRefused("TUPLE with too few items (or an allocator event in a tuple)")
                t = tuple(stack[-n:])
                del stack[-n:]
                self._count()
                stack.append(t)
            elif op == 0x29:  # EMPTY_TUPLE
                stack.append(())
            elif op == 0x74 or op == 0x6C or op == 0x64 or op == 0x91:  # TUPLE, LIST, DICT, FROZENSET
                if not marks:
                    raise SnapshotRefused("TUPLE/LIST/DICT without a MARK")
                k = marks.pop()
                items = stack[k + 1:]
                del stack[k:]
                if len(items) > limits.max_container:
                    raise SnapshotRefused(f"a container of more than {limits.max_container:,} items")
                if _ROW in items:
                    raise SnapshotRefused("an allocator event stored outside a device trace list")
                self._count()
                if op == 0x74:
                    stack.append(tuple(items))
                elif op == 0x6C:
                    stack.append(items)
                elif op == 0x91:
                    try:
                        stack.append(frozenset(items))
                    except TypeError as exc:
                        raise SnapshotRefused(f"a set item is not hashable ({exc})") from None
                else:
                    if len(items) % 2:
                        raise SnapshotRefused("DICT with an odd number of items")
                    try:
                        stack.append({items[i]: items[i + 1] for i in range(0, len(items), 2)})
                    except TypeError as exc:
                        raise SnapshotRefused(f"a dict key is not hashable ({exc})") from None
            elif op == 0x71:  # BINPUT
                if not stack:
                    raise SnapshotRefused("BINPUT with an empty stack")
                put(take(1)[0], stack[-1])
            elif op == 0x72:  # LONG_BINPUT
                if not stack:
                    raise SnapshotRefused("LONG_BINPUT with an empty stack")
                put(struct.unpack("<I", take(4))[0], stack[-1])
            elif op == 0x2E:  # STOP
                if len(stack) != 1 or marks:
                    raise SnapshotRefused("the pickle stops with a malformed stack")
                return stack[0]
            elif op == 0x80:  # PROTO
                proto = take(1)[0]
                if proto > 5:
                    raise SnapshotRefused(f"unsupported pickle protocol {proto}")
            elif op == 0x47:  # BINFLOAT
                stack.append(struct.unpack(">d", take(8))[0])
            elif op == 0x8F:  # EMPTY_SET
                self._count()
                stack.append(set())
            elif op == 0x90:  # ADDITEMS
                if not marks:
                    raise SnapshotRefused("ADDITEMS without a MARK")
                k = marks.pop()
                items = stack[k + 1:]
                del stack[k:]
                if not stack or type(stack[-1]) is not set:
                    raise SnapshotRefused("ADDITEMS on something that is not a set")
                try:
                    stack[-1].update(items)
                except TypeError as exc:
                    raise SnapshotRefused(f"a set item is not hashable ({exc})") from None
            elif op == 0x30:  # POP
                if not stack:
                    raise SnapshotRefused("POP with an empty stack")
                if stack.pop() is _MARK:
                    marks.pop()
            elif op == 0x31:  # POP_MARK
                if not marks:
                    raise SnapshotRefused("POP_MARK without a MARK")
                del stack[marks.pop():]
            elif op == 0x32:  # DUP
                if not stack:
                    raise SnapshotRefused("DUP with an empty stack")
                stack.append(stack[-1])
            elif op == 0x8B:  # LONG4
                n = struct.unpack("<i", take(4))[0]
                if n < 0 or n > limits.max_int_bytes:
                    raise SnapshotRefused(f"an integer of {n} bytes is over the limit of {limits.max_int_bytes} "
                                          "(Limits.max_int_bytes)")
                stack.append(int.from_bytes(take(n), "little", signed=True))
            elif op == 0x8D:  # BINUNICODE8
                self._count()
                stack.append(utf8(take(self._check_len(struct.unpack("<Q", take(8))[0], "string"))))
            elif op == 0x43:  # SHORT_BINBYTES
                self._count()
                stack.append(take(take(1)[0]))
            elif op == 0x42:  # BINBYTES
                self._count()
                stack.append(take(self._check_len(struct.unpack("<I", take(4))[0], "bytes value")))
            elif op == 0x8E or op == 0x96:  # BINBYTES8, BYTEARRAY8
                self._count()
                data = take(self._check_len(struct.unpack("<Q", take(8))[0], "bytes value"))
                stack.append(bytearray(data) if op == 0x96 else data)
            elif op == 0x55:  # SHORT_BINSTRING (protocol 2 str), decoded as torch's reader would: ASCII
                self._count()
                stack.append(ascii_text(take(take(1)[0])))
            elif op == 0x54:  # BINSTRING
                self._count()
                n = struct.unpack("<i", take(4))[0]
                stack.append(ascii_text(take(self._check_len(n, "string"))))
            elif op in _TEXT_OPS:
                stack.append(self._text(op))
            elif op == 0x67 or op == 0x70:  # GET, PUT (text)
                idx = text_int(self._line())
                if op == 0x67:
                    stack.append(self._get(idx))
                else:
                    if not stack:
                        raise SnapshotRefused("PUT with an empty stack")
                    put(idx, stack[-1])
            elif op in _REFUSED_OPS:
                raise UnsafePickleError(f"refusing opcode {_REFUSED_OPS[op]} at byte "
                                        f"{self.consumed + pos}: snapshot pickles are plain data and "
                                        "may name no Python object")
            else:
                raise SnapshotRefused(f"unknown pickle opcode 0x{op:02x} at byte {self.consumed + pos}")

    def _fast(self, buf: bytes, pos: int, stack: list, marks: list) -> int:
        """Take the run of events at ``pos`` through the C runs; 0 if there is none (or no C runs).

        A run may span batches of list items: each ``APPENDS MARK`` inside it is applied here,
        as the interpreter would (items since the mark appended to the list below it).
        """
        if self.crun is None or not buf.startswith(b"}\x94(", pos) or not any(buf.startswith(x.raw_refs[0], pos + 3)
                                                         for x in self.layouts):
            return 0  # not the start of an event of a learned layout
        # events the interpreter built since the last rows of this list (the trace's first events, whose
        # layout was being learned, or one with an action string seen for the first time) become rows
        # right before this run's: each device's trace is then one contiguous range of rows
        if marks and marks[-1] >= 1:
            k = marks[-1]
            target = stack[k - 1]
            j = len(stack)
            while j > k + 1 and stack[j - 1] is not _ROW:
                j -= 1
            tail = stack[j:]
            hit = self.rows.trace_refs.get(id(target))
            if tail and type(target) is list and ((hit is not None and hit[0] is target) or (
                    not target and hit is None)) and all(type(x) is dict and isinstance(x.get("action"), str)
                                                         for x in tail):
                for x in tail:
                    self.rows.add_dict(x)
                stack[j:] = [_ROW] * len(tail)
        first_row = self.rows.count
        n, end, cuts = self.crun.run(buf, pos, self.layouts)
        if not n:
            return 0
        self.pos = end
        if cuts:
            if not marks or marks[-1] < 1:
                raise SnapshotRefused("list items without a MARK")
            k = marks[-1]
            target = stack[k - 1]
            stack.extend([_ROW] * cuts[0])
            items = stack[k + 1:]
            del stack[k + 1:]
            self._append(target, items, first_row + cuts[0])
            for a, b in zip(cuts, cuts[1:]):
                self._append(target, [_ROW] * (b - a), first_row + b)
            stack.extend([_ROW] * (n - cuts[-1]))
        else:
            stack.extend([_ROW] * n)
        return n

    def _append(self, target: Any, items: list, rows_end: int | None = None) -> None:
        if type(target) is not list:
            raise SnapshotRefused("APPENDS on something that is not a list")
        self.rows.append_items(target, items, rows_end)

    def _text(self, op: int) -> Any:
        line = self._line()
        self._count()
        if op == 0x49:  # INT
            if line in (b"00", b"01"):
                return line == b"01"
            return text_int(line)
        if op == 0x4C:  # LONG
            return text_int(line.rstrip(b"L"))
        if op == 0x46:  # FLOAT
            try:
                return float(line)
            except ValueError:
                raise SnapshotRefused("a FLOAT opcode holds no number") from None
        if op == 0x56:  # UNICODE
            return line.decode("raw-unicode-escape")
        # STRING: a quoted Python 2 string literal
        if len(line) < 2 or line[0] != line[-1] or line[:1] not in (b"'", b'"'):
            raise SnapshotRefused("a STRING opcode is not quoted")
        try:
            import codecs

            return ascii_text(codecs.escape_decode(line[1:-1])[0])
        except ValueError:
            raise SnapshotRefused("a STRING opcode holds a bad escape") from None


_TEXT_OPS = {0x49, 0x4C, 0x46, 0x56, 0x53}  # INT, LONG, FLOAT, UNICODE, STRING
_ROW = ROW
_MARK = _Mark()


def read_pickle(fh: BinaryIO, *, limits: Limits | None = None, progress: Callable[[int], None] | None = None,
                c_reader: bool = True) -> tuple[Any, EventRows]:
    """Read a plain-data pickle, turning trace events into rows; returns ``(top object, rows)``.

    In the top object, each list of trace events is replaced by a :class:`TraceRef`; pass it to
    :meth:`EventRows.rows_of` for its row indices. ``c_reader=False`` reads every event with the
    interpreter even where the C runs were built (:mod:`tbmem._internal.snapshot.pickle_crun`; the same rows,
    about 50 times slower: the tests' reference).

    Raises:
        tbmem._internal.snapshot.safe_pickle.UnsafePickleError: the file names a Python object.
        SnapshotRefused: malformed, truncated, or over a limit.
    """
    machine = _Machine(fh, limits or Limits(), progress, c_reader)
    try:
        top = machine.run()
    finally:
        machine.close()
    if top is _ROW:
        raise SnapshotRefused("the pickle holds a single allocator event, not a snapshot")
    return top, machine.rows
