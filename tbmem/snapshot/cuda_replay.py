"""Allocator events paired by address: which ``alloc`` each ``free_requested``/``free_completed`` ends.

An allocation runs from its ``alloc`` to the next ``free_completed`` of its address (only then
can the allocator reuse the memory); the ``free_requested`` between them (a tensor freed while
a stream it was recorded on still used it) marks its free as pending. Frees with no ``alloc``
before them in the trace end memory allocated before it. Events are paired per address in
event order with a stable sort and a few vectorised scans (int32 positions), so ten million
events take about a second and a few hundred MB.

Example:
    >>> import numpy as np
    >>> from tbmem.snapshot.cuda_replay import pair_allocations
    >>> act = np.array([1, 2, 3, 1, 2])      # alloc, free_requested, free_completed, alloc, free_requested
    >>> addr = np.array([64, 64, 64, 64, 64])
    >>> p = pair_allocations(act, addr)
    >>> p.starts.tolist(), p.ends.tolist(), p.freereq.tolist(), p.pending.tolist()
    ([0, 3], [2, -1], [1, 4], [False, True])
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tbmem.snapshot.pickle_rows import ACTION_CODE

__all__ = ["Pairs", "pair_allocations"]

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


def _next_of(mask: np.ndarray, limit: np.ndarray) -> np.ndarray:
    """For each position i, the first position j > i with ``mask[j]``, or ``limit[i]`` when that
    is not before ``limit[i]`` (the end of i's address group)."""
    m = mask.shape[0]
    pos = np.where(mask, np.arange(m, dtype=np.int32), np.int32(m))
    nxt = np.minimum.accumulate(pos[::-1])[::-1]
    out = np.empty(m, dtype=np.int32)
    out[:-1] = nxt[1:]
    out[-1:] = m
    return np.minimum(out, limit)


def pair_allocations(act: np.ndarray, addr: np.ndarray) -> Pairs:
    """Pair the ``alloc``/``free_requested``/``free_completed`` events of one device trace by address."""
    rel = np.flatnonzero((act == _ALLOC) | (act == _FREE_REQ) | (act == _FREE_DONE)).astype(np.int32)
    empty = np.zeros(0, dtype=np.int64)
    if rel.shape[0] == 0:
        return Pairs(empty, empty, empty, np.zeros(0, dtype=bool), empty, empty, empty, 0)
    # by address, then event (a stable sort of event-ordered rows)
    order = rel[np.argsort(addr[rel], kind="stable")]
    a = act[order]
    g = addr[order]
    m = order.shape[0]
    new_group = np.empty(m, dtype=bool)
    new_group[0] = True
    np.not_equal(g[1:], g[:-1], out=new_group[1:])
    del g
    idx = np.arange(m, dtype=np.int32)
    # the first position of the next address group, after each position
    group_end = _next_of(new_group, np.full(m, m, dtype=np.int32))
    is_alloc, is_req, is_done = a == _ALLOC, a == _FREE_REQ, a == _FREE_DONE
    del a
    na = _next_of(is_alloc, group_end)
    nd = _next_of(is_done, group_end)
    nr = _next_of(is_req, group_end)
    ai = idx[is_alloc]
    a_na, a_nd, a_nr, a_end = na[ai], nd[ai], nr[ai], group_end[ai]
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
    paired_done = np.zeros(m, dtype=bool)
    paired_done[a_nd[done]] = True
    claimed_req = np.zeros(m, dtype=bool)
    claimed_req[a_nr[req_ok]] = True
    lone_done_pos = idx[is_done & ~paired_done]
    # a lone free_completed's own free_requested: the last unclaimed request since the previous
    # alloc or free_completed of its address
    last_req = np.maximum.accumulate(np.where(is_req & ~claimed_req, idx, np.int32(-1)))
    last_ad = np.maximum.accumulate(np.where(is_alloc | is_done, idx, np.int32(-1)))
    prev_req = np.where(lone_done_pos > 0, last_req[np.maximum(lone_done_pos - 1, 0)], -1)
    prev_ad = np.where(lone_done_pos > 0, last_ad[np.maximum(lone_done_pos - 1, 0)], -1)
    start_of_group = np.maximum.accumulate(np.where(new_group, idx, np.int32(0)))
    own = (prev_req >= 0) & (prev_req > prev_ad) & (prev_req >= start_of_group[lone_done_pos])
    lone_done_req = np.where(own, order[np.maximum(prev_req, 0)], -1).astype(np.int64)
    claimed_req[prev_req[own]] = True
    # a request never completed before the next alloc of its address (or the end): still alive
    ri = idx[is_req & ~claimed_req]
    lone_req_pos = ri[nd[ri] >= na[ri]]
    # back to event order: the allocs are the alloc events, in the order they happened
    starts = np.flatnonzero(act == _ALLOC)
    rank = np.empty(act.shape[0], dtype=np.int32)
    rank[order[ai]] = np.arange(ai.shape[0], dtype=np.int32)
    perm = rank[starts]
    ends, freereq, pending = ends[perm], freereq[perm], pending[perm]
    return Pairs(starts=starts, ends=ends, freereq=freereq, pending=pending,
                 lone_done=order[lone_done_pos].astype(np.int64), lone_done_req=lone_done_req,
                 lone_req=order[lone_req_pos].astype(np.int64), reused=int(reused.sum()))
