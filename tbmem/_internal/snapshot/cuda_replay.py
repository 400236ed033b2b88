"""Allocator events paired by address: which ``alloc`` each ``free_requested``/``free_completed`` ends.

An allocation runs from its ``alloc`` to the next ``free_completed`` of its address (only then
can the allocator reuse the memory); the ``free_requested`` between them (a tensor freed while
a stream it was recorded on still used it) marks its free as pending. Frees with no ``alloc``
before them in the trace end memory allocated before it. Events are paired per address in
event order with a stable sort and a few vectorised scans (int32 positions), so ten million
events take about a second and a few hundred MB.

Example:
    >>> import numpy as np
    >>> from tbmem._internal.snapshot.cuda_replay import pair_allocations
    >>> act = np.array([1, 2, 3, 1, 2])      # alloc, free_requested, free_completed, alloc, free_requested
    >>> addr = np.array([64, 64, 64, 64, 64])
    >>> p = pair_allocations(act, addr)
    >>> p.starts.tolist(), p.ends.tolist(), p.freereq.tolist(), p.pending.tolist()
    ([0, 3], [2, -1], [1, 4], [False, True])
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tbmem._internal.snapshot.pickle_rows import ACTION_CODE

__all__ = ["Pairs", "pair_allocations", "pair_allocations_numpy", "C_PAIRING"]

try:  # the same pairing in one pass of C (tbmem/_internal/snapshot/_pair.c), where the install could compile it
    from tbmem._internal.snapshot import _creader as _C
except ImportError:  # pragma: no cover - no C compiler at install time
    _C = None
#: Whether allocator events are paired in C (False: no C compiler when tbmem was installed).
C_PAIRING = _C is not None

_ALLOC, _FREE_REQ, _FREE_DONE = ACTION_CODE["alloc"], ACTION_CODE["free_requested"], ACTION_CODE["free_completed"]


@dataclass
class Pairs:
    """Event indices of each allocation of a trace and of the frees of memory allocated before it.

    ``starts``/``ends``/``freereq``/``pending``: per ``alloc`` event (in event order), its end
    (-1 alive), its ``free_requested`` (-1 none) and whether its free was requested but not
    completed. ``lone_done``/``lone_done_req``: ``free_completed`` events of blocks allocated
    before the trace and their ``free_requested`` (-1 none). ``lone_req``: ``free_requested``
    events of blocks allocated before the trace whose free never completed. ``reused``: allocs
    ended by a later ``alloc`` of the same address without a free in between.
    """

    starts: np.ndarray
    ends: np.ndarray
    freereq: np.ndarray
    pending: np.ndarray
    lone_done: np.ndarray
    lone_done_req: np.ndarray
    lone_req: np.ndarray
    reused: int


def _stable_order(key: np.ndarray) -> np.ndarray:
    """``np.argsort(key, kind="stable")``, faster: CUDA blocks are 512-byte aligned, so addresses
    usually fit 32 bits as multiples of 512, sorted by two 16-bit radix passes."""
    lo, hi = int(key.min()), int(key.max())
    shift = 9 if not bool(np.any((key - lo) & 511)) else 0
    if (hi - lo) >> shift >= 2**32:
        return np.argsort(key, kind="stable")
    k = ((key - lo) >> shift).astype(np.uint32)
    order = np.argsort((k & 0xFFFF).astype(np.uint16), kind="stable")  # numpy's stable sort of 16 bits: radix
    high = (k >> 16).astype(np.uint16)
    return order[np.argsort(high[order], kind="stable")] if bool(high.any()) else order


def _after(sorted_pos: np.ndarray, p: np.ndarray, limit: np.ndarray, m: int) -> np.ndarray:
    """For each position of ``p``: the first of ``sorted_pos`` after it, or ``limit`` when that is not before it."""
    if not sorted_pos.shape[0]:
        return np.minimum(np.full(p.shape[0], m), limit).astype(np.int32)
    k = np.searchsorted(sorted_pos, p, side="right")
    nxt = np.where(k < sorted_pos.shape[0], sorted_pos[np.minimum(k, sorted_pos.shape[0] - 1)], m)
    return np.minimum(nxt, limit).astype(np.int32)


def _before(sorted_pos: np.ndarray, p: np.ndarray) -> np.ndarray:
    """For each position of ``p``: the last of ``sorted_pos`` before it, or -1."""
    if not sorted_pos.shape[0]:
        return np.full(p.shape[0], -1, dtype=np.int32)
    k = np.searchsorted(sorted_pos, p, side="left") - 1
    return np.where(k >= 0, sorted_pos[np.maximum(k, 0)], -1).astype(np.int32)


def pair_allocations(act: np.ndarray, addr: np.ndarray) -> Pairs:
    """Pair the ``alloc``/``free_requested``/``free_completed`` events of one device trace by address.

    In one pass of C where it was built (a table of the addresses seen), else
    :func:`pair_allocations_numpy`: the same pairs.
    """
    if _C is None or act.shape[0] >= 2**62:
        return pair_allocations_numpy(act, addr)
    act = np.ascontiguousarray(act, dtype=np.int8)
    addr = np.ascontiguousarray(addr, dtype=np.int64)
    counts = np.bincount(act.view(np.uint8), minlength=256)
    na, nr, nd = int(counts[_ALLOC]), int(counts[_FREE_REQ]), int(counts[_FREE_DONE])
    ends, freereq = np.empty(na, dtype=np.int64), np.empty(na, dtype=np.int64)
    pending = np.empty(na, dtype=bool)
    lone_done, lone_done_req, lone_req = np.empty(nd, dtype=np.int64), np.empty(nd, dtype=np.int64), \
        np.empty(nr, dtype=np.int64)
    n_done, n_req, reused = _C.pair(act, addr, (ends, freereq, pending.view(np.uint8), lone_done, lone_done_req,
                                                lone_req))
    # lone frees in the numpy version's order: by address, then event
    lone_done, lone_done_req, lone_req = lone_done[:n_done], lone_done_req[:n_done], lone_req[:n_req]
    o = np.lexsort((lone_done, addr[lone_done]))
    r = np.lexsort((lone_req, addr[lone_req]))
    return Pairs(starts=np.flatnonzero(act == _ALLOC), ends=ends, freereq=freereq, pending=pending,
                 lone_done=lone_done[o], lone_done_req=lone_done_req[o], lone_req=lone_req[r], reused=int(reused))


def pair_allocations_numpy(act: np.ndarray, addr: np.ndarray) -> Pairs:
    """:func:`pair_allocations` with numpy (events sorted by address, neighbours compared): the
    reference the C pairing is tested against."""
    rel = np.flatnonzero((act == _ALLOC) | (act == _FREE_REQ) | (act == _FREE_DONE)).astype(np.int32)
    empty = np.zeros(0, dtype=np.int64)
    if rel.shape[0] == 0:
        return Pairs(empty, empty, empty, np.zeros(0, dtype=bool), empty, empty, empty, 0)
    # by address, then event (a stable sort of event-ordered rows); then only positions of this order
    # are compared, each kind of event as its own sorted array of positions (searchsorted, no full scans)
    order = rel[_stable_order(addr[rel])]
    del rel
    m = order.shape[0]
    g = addr[order]
    new_group = np.empty(m, dtype=bool)
    new_group[0] = True
    np.not_equal(g[1:], g[:-1], out=new_group[1:])
    del g
    a = act[order]
    ai = np.flatnonzero(a == _ALLOC).astype(np.int32)
    ri = np.flatnonzero(a == _FREE_REQ).astype(np.int32)
    di = np.flatnonzero(a == _FREE_DONE).astype(np.int32)
    gs = np.flatnonzero(new_group).astype(np.int32)
    del a, new_group
    m32 = np.full(1, m, dtype=np.int32)
    end_of = lambda p: _after(gs, p, m32, m)  # noqa: E731 - the first position of the next address
    a_end = end_of(ai)
    a_na = np.minimum(np.concatenate((ai[1:], m32)), a_end)  # the next alloc, if of the same address
    a_nd = _after(di, ai, a_end, m)
    a_nr = _after(ri, ai, a_end, m)
    done = a_nd < a_na
    # a later alloc of the address ends a block whose free the trace did not complete (or show)
    reused = ~done & (a_na < a_end)
    pending = ~done & ~reused & (a_nr < a_na)
    ends = np.full(ai.shape[0], -1, dtype=np.int64)
    ends[done] = order[a_nd[done]]
    ends[reused] = order[a_na[reused]]
    req_ok = a_nr < np.where(done, a_nd, a_na)
    freereq = np.where(req_ok, order[np.minimum(a_nr, m - 1)], -1).astype(np.int64)
    # frees that end no alloc of the trace end memory allocated before it
    paired = np.zeros(m, dtype=bool)
    paired[a_nd[done]] = True
    claimed = np.zeros(m, dtype=bool)
    claimed[a_nr[req_ok]] = True
    lone_done_pos = di[~paired[di]]
    # a lone free_completed's own free_requested: the last unclaimed request since the previous
    # alloc or free_completed of its address
    free_req = ri[~claimed[ri]]
    prev_req = _before(free_req, lone_done_pos)
    prev_ad = np.maximum(_before(ai, lone_done_pos), _before(di, lone_done_pos))
    group_start = _before(np.concatenate((gs, m32)), lone_done_pos + 1)
    own = (prev_req >= 0) & (prev_req > prev_ad) & (prev_req >= group_start)
    lone_done_req = np.where(own, order[np.maximum(prev_req, 0)], -1).astype(np.int64)
    claimed[prev_req[own]] = True
    # a request never completed before the next alloc of its address (or the end): still alive
    rest = ri[~claimed[ri]]
    r_end = end_of(rest)
    lone_req_pos = rest[_after(di, rest, r_end, m) >= _after(ai, rest, r_end, m)]
    # back to event order: the allocs are the alloc events, in the order they happened
    starts = np.flatnonzero(act == _ALLOC)
    rank = np.empty(act.shape[0], dtype=np.int32)
    rank[order[ai]] = np.arange(ai.shape[0], dtype=np.int32)
    perm = rank[starts]
    ends, freereq, pending = ends[perm], freereq[perm], pending[perm]
    return Pairs(starts=starts, ends=ends, freereq=freereq, pending=pending,
                 lone_done=order[lone_done_pos].astype(np.int64), lone_done_req=lone_done_req,
                 lone_req=order[lone_req_pos].astype(np.int64), reused=int(reused.sum()))
