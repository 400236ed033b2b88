"""The second half of the vectorised pickle reader: a run of parsed events turned into rows and memo entries.

:func:`~tbmem.snapshot.pickle_fast.scan` parses candidate events side by side; :func:`commit`
resolves what they refer to (action strings, frames lists new or seen before, inline strings)
against the interpreter's memo, stops the run before the first event it cannot account for,
appends the rows to :class:`~tbmem.snapshot.pickle_rows.EventRows` and the memo entries the
general interpreter would have stored, so that it can carry on after the run.

Example:
    >>> from tbmem.snapshot.pickle_commit import State
    >>> State().stacks
    {}
"""

from __future__ import annotations

import re
from typing import Any, Sequence

import numpy as np

from tbmem.snapshot.pickle_fast import Layout, Scan
from tbmem.snapshot.pickle_rows import ACTION_CODE, NO_TIME, EventRows, Memo, StackRef

__all__ = ["State", "commit"]

_H = 0x68


def _lookup(u: np.ndarray, table: np.ndarray, keys: np.ndarray, missing: int) -> np.ndarray:
    """``table[j]`` where ``keys == u[j]`` (``u`` sorted, unique); ``missing`` for other keys."""
    if u.shape[0] == 0:
        return np.full(keys.shape, missing, dtype=np.int64)
    pos = np.minimum(np.searchsorted(u, keys), u.shape[0] - 1)
    return np.where(u[pos] == keys, table[pos], missing)


def _resolve(memo: Memo, keys: np.ndarray, base: int, value_of, missing: int) -> np.ndarray:
    """``value_of(memo[k])`` for each memo index ``k < base`` (each distinct index looked up once, in the
    order of first use: what value_of interns gets ids in event order, as in the C reader)."""
    u, first = np.unique(keys[(keys >= 0) & (keys < base)], return_index=True)
    table = np.empty(u.shape[0], dtype=np.int64)
    for j in np.argsort(first, kind="stable").tolist():
        table[j] = value_of(memo[int(u[j])])
    return _lookup(u, table, keys, missing)


def _strings(buf: bytes, pos: np.ndarray, length: np.ndarray, cache: dict[Any, str]) -> np.ndarray:
    """Decode inline strings (an object array)."""
    values, which = _distinct_strings(buf, pos, length, cache)
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out[which]


def _distinct_strings(buf: bytes, pos: np.ndarray, length: np.ndarray,
                      cache: dict[Any, str]) -> tuple[list[str], np.ndarray]:
    """Decode inline strings, each distinct value once (values of at most 8 bytes compared as words):
    (the distinct values, the index of each string's value)."""
    out = np.zeros(pos.shape[0], dtype=np.int64)
    distinct: list[str] = []
    short = length <= 8
    if short.any():
        idx = np.flatnonzero(short)
        n = len(buf)
        if n >= 8:
            # the 8 bytes from each position (an unaligned view), cut to the string's length
            at = np.ndarray(shape=(n - 7,), dtype="<u8", buffer=buf, strides=(1,))
            start = pos[idx]
            lens = length[idx]
            shift = np.minimum(start, n - 8)  # near the end: read the last 8 bytes and shift
            words = at[shift] >> (8 * (start - shift)).astype(np.uint64)
            words &= np.array([(1 << (8 * k)) - 1 for k in range(8)] + [(1 << 64) - 1], dtype=np.uint64)[lens]
        else:
            words = np.array([int.from_bytes(buf[int(q):int(q) + int(m)], "little")
                              for q, m in zip(pos[idx], length[idx])], dtype=np.uint64)
        keys = words ^ (length[idx].astype(np.uint64) << np.uint64(59))
        uniq, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        for key, k in zip(uniq.tolist(), first.tolist()):
            value = cache.get(("w", key))
            if value is None:
                p0, n0 = int(pos[idx[k]]), int(length[idx[k]])
                value = cache[("w", key)] = _decode(buf[p0:p0 + n0])
            distinct.append(value)
        out[idx] = inverse.reshape(-1)
    for i in np.flatnonzero(~short).tolist():
        raw = buf[int(pos[i]):int(pos[i] + length[i])]
        value = cache.get(raw)
        if value is None:
            if len(cache) > 100_000:
                cache.clear()
            value = cache[raw] = _decode(raw)
        out[i] = len(distinct)
        distinct.append(value)
    return distinct, out


def _decode(raw: bytes) -> str:
    try:
        return raw.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


class State:
    """What the fast path remembers between runs: stacks by reference bytes, decoded strings."""

    def __init__(self) -> None:
        self.stacks: dict[int, tuple[int, int]] = {}  # first hash -> (second hash, stack id)
        self.strings: dict[Any, str] = {}
        self.stack_refs: list[StackRef] = []
        self.ref_slots: np.ndarray | None = None  # the memo slot of each StackRef

    def forget(self) -> None:
        """A memo entry was overwritten (protocol <= 3 PUT): references may mean something else now."""
        self.stacks.clear()


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


def commit(sc: Scan, i: int, buf: bytes, layouts: Sequence[Layout], memo: Memo, rows: EventRows,
           state: State) -> int:
    """Turn the run of events starting at candidate ``i`` into rows and memo entries.

    Returns how many events were taken (0: the first one needs the general interpreter). An
    event whose references do not resolve to what torch writes ends the run before it.
    """
    n = int(sc.chain[i])
    sel = np.arange(i, i + n)
    base = len(memo)
    stack_refs = state.stack_refs
    cache = state.strings
    new = sc.list_ref[sel] < 0
    count = 1 + sc.inline[sel] + new
    off = base + np.concatenate(([0], np.cumsum(count)[:-1]))
    list_memo = np.where(new, off + 1 + sc.inline_before_frames[sel], -1)
    good = np.ones(n, dtype=bool)
    # frames of new lists: the same reference bytes are the same stack (frame dicts stored earlier);
    # references to lists stored before the run: a StackRef's stack, or a list's own. What this interns
    # is interned in the order of first use, as the C reader (pickle_crun) meets it.
    sid = np.full(n, -1, dtype=np.int64)
    ref = sc.list_ref[sel]
    outside = ~new & (ref < base)
    jobs: list[tuple[int, int, int]] = []  # (first event, 0 new list / 1 stored list, distinct value)
    if new.any():
        where = np.flatnonzero(new)
        hashes = sc.span_hash[sel[where]]
        uniq, first, inverse = np.unique(hashes[:, 0], return_index=True, return_inverse=True)
        table = np.empty(uniq.shape[0], dtype=np.int64)
        jobs += [(int(where[k]), 0, j) for j, k in enumerate(first.tolist())]
    if outside.any():
        where_out = np.flatnonzero(outside)
        u_out, first_out, inv_out = np.unique(ref[outside], return_index=True, return_inverse=True)
        table_out = np.empty(u_out.shape[0], dtype=np.int64)
        jobs += [(int(where_out[k]), 1, j) for j, k in enumerate(first_out.tolist())]
    known = state.stacks
    for _first_event, kind, j in sorted(jobs):
        if kind:
            v = memo[int(u_out[j])]
            table_out[j] = v.sid if type(v) is StackRef else rows.stack_id(v) if type(v) is list else -3
            continue
        h, k = int(uniq[j]), int(first[j])
        hit = known.get(h)
        if hit is None or hit[0] != int(hashes[k, 1]):
            e = int(sel[where[k]])
            span = buf[int(sc.span_pos[e]):int(sc.span_pos[e] + sc.span_len[e])]
            hit = (int(hashes[k, 1]), _new_stack(span, memo, base, rows))
            if hit[1] >= 0:
                known[h] = hit
        table[j] = hit[1]
    if new.any():
        got = table[inverse.reshape(-1)]
        # a second hash guards against two stacks sharing the first
        got[hashes[:, 1] != hashes[first[inverse.reshape(-1)], 1]] = -1
        sid[where] = got
        good[where[sid[where] < 0]] = False
    if outside.any():
        got = table_out[inv_out.reshape(-1)]
        sid[outside] = got
        good[where_out[got == -3]] = False
    inside = ~new & (ref >= base)
    if inside.any():
        where = np.flatnonzero(inside)
        src = _lookup(list_memo[new], np.flatnonzero(new), ref[inside], -1)
        ok_inside = (src >= 0) & (src < where)
        sid[where] = np.where(ok_inside, sid[np.maximum(src, 0)], -1)
        good[where[~ok_inside]] = False
    # action strings
    action = _resolve(memo, sc.action_ref[sel], base, lambda v: ACTION_CODE.get(v, 0) if type(v) is str else -1, -1)
    good &= action >= 0
    # user_metadata
    meta = np.full(n, -1, dtype=np.int64)
    if "user_metadata" in sc.str_pos:
        spos = sc.str_pos["user_metadata"][sel]
        inl = spos >= 0
        if inl.any():
            texts = _strings(buf, spos[inl], sc.str_len["user_metadata"][sel][inl], cache)
            uniq, first, inverse = np.unique(texts.astype(str), return_index=True, return_inverse=True)
            ids = np.empty(uniq.shape[0], dtype=np.int64)
            for j in np.argsort(first, kind="stable").tolist():  # interned in event order
                ids[j] = rows.string_id(str(uniq[j])) if uniq[j] else -1
            meta[inl] = ids[inverse.reshape(-1)]
        mref = sc.meta_ref[sel]
        isref = (mref >= 0) & ~inl
        if isref.any():
            for j in np.flatnonzero(isref).tolist():
                v = memo[int(mref[j])] if mref[j] < base else None
                if type(v) is str:
                    meta[j] = rows.string_id(v) if v else -1
                else:
                    good[j] = False
    bad = np.flatnonzero(~good)
    n = int(bad[0]) if bad.shape[0] else n
    if n == 0:
        return 0
    sel, count, new, sid = sel[:n], count[:n], new[:n], sid[:n]
    # memo entries, in file order: the event dict, then per key its inline string or new list (as
    # slots of the memo's table of objects: 0 is an event)
    total = int(count.sum())
    entries = np.zeros(total, dtype=np.int32)
    off = off[:n] - base
    cursor = off + 1
    for li, layout in enumerate(layouts):
        mine = sc.layout[sel] == li
        if not mine.any():
            continue
        for key in layout.keys:
            if key == "frames":
                put = mine & new
                if put.any():
                    top = int(sid[put].max())
                    stack_refs.extend(StackRef(k) for k in range(len(stack_refs), top + 1))
                    if state.ref_slots is None or state.ref_slots.shape[0] != len(stack_refs):
                        state.ref_slots = np.array([memo.slot(r) for r in stack_refs], dtype=np.int32)
                    entries[cursor[put]] = state.ref_slots[sid[put]]
                cursor = cursor + put
            elif key in sc.str_pos:
                spos = sc.str_pos[key][sel]
                put = mine & (spos >= 0)
                if put.any():
                    values, which = _distinct_strings(buf, spos[put], sc.str_len[key][sel][put], cache)
                    entries[cursor[put]] = np.array([memo.slot(v) for v in values], dtype=np.int32)[which]
                cursor = cursor + put
    memo.extend_slots(entries)
    time = np.where(sc.has_time[sel], sc.time[sel], NO_TIME)
    rows.add_block(action=action[:n], addr=sc.addr[sel], size=sc.size[sel], time=time, stack=sid,
                   meta=meta[:n], stream=sc.stream[sel])
    return n
