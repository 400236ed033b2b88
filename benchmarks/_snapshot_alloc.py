"""A small model of PyTorch's CUDA caching allocator, so that the synthetic snapshot's segments are what
its own trace reserved: blocks carved out of segments best-fit, split and merged again on free, a
segment reserved only when no free block fits, and released by ``torch.cuda.empty_cache()``.

The rules are the caching allocator's (c10/cuda/CUDACachingAllocator.cpp): requests of at most
1 MiB come from the small pool's 2 MiB segments, larger ones from the large pool (a 20 MiB
segment below 10 MiB, else the request rounded up to 2 MiB); a free block is split when what is
left is at least 512 bytes (small pool) or more than 1 MiB (large pool), otherwise the whole
block is handed out; freed blocks merge with free neighbours of their segment.

Example:
    >>> m = CachingAllocator(0x1000_0000)
    >>> seg, addr = m.malloc(4096, ctx=None)
    >>> seg, hex(addr), m.reserved()
    ((268435456, 2097152), '0x10000000', 2097152)
    >>> m.free(addr), m.empty_cache(), m.reserved()
    (None, [(268435456, 2097152)], 0)
"""

from __future__ import annotations

import bisect

__all__ = ["CachingAllocator", "SMALL", "LARGE"]

SMALL, LARGE = "small", "large"
_SMALL_SIZE, _SMALL_BUFFER, _LARGE_BUFFER, _MIN_LARGE = 1 << 20, 2 << 20, 20 << 20, 10 << 20
_ROUND_LARGE, _MIN_BLOCK = 2 << 20, 512


class CachingAllocator:
    """Segments and blocks of one device; addresses of new segments grow from ``base``."""

    def __init__(self, base: int) -> None:
        self.next_addr = base
        self.segs: dict[int, tuple[int, str, object]] = {}  # segment address -> (size, pool, ctx)
        self.size: dict[int, int] = {}  # block address -> block size
        self.seg_of: dict[int, int] = {}  # block address -> its segment's address
        self.used: dict[int, tuple[int, object]] = {}  # allocated block address -> (requested bytes, ctx)
        self.free_lists: dict[str, list[tuple[int, int]]] = {SMALL: [], LARGE: []}  # sorted (size, addr)
        self.free_end: dict[int, int] = {}  # free block end -> its address

    def reserved(self) -> int:
        """Bytes of all segments."""
        return sum(s for s, _p, _c in self.segs.values())

    def _add_free(self, addr: int, size: int, pool: str) -> None:
        bisect.insort(self.free_lists[pool], (size, addr))
        self.free_end[addr + size] = addr
        self.size[addr] = size

    def _del_free(self, addr: int, size: int, pool: str) -> None:
        lst = self.free_lists[pool]
        del lst[bisect.bisect_left(lst, (size, addr))]
        del self.free_end[addr + size]

    def malloc(self, request: int, ctx: object) -> tuple[tuple[int, int] | None, int]:
        """Allocate: (the segment reserved for it as (address, size), or None; the block's address)."""
        size = max(_MIN_BLOCK, -(-request // _MIN_BLOCK) * _MIN_BLOCK)
        pool = SMALL if size <= _SMALL_SIZE else LARGE
        lst = self.free_lists[pool]
        i = bisect.bisect_left(lst, (size, -1))
        new_seg = None
        if i < len(lst):
            bsize, addr = lst[i]
            self._del_free(addr, bsize, pool)
        else:
            bsize = _SMALL_BUFFER if pool == SMALL else _LARGE_BUFFER if size < _MIN_LARGE else \
                -(-size // _ROUND_LARGE) * _ROUND_LARGE
            addr = self.next_addr
            self.next_addr += bsize
            self.segs[addr] = (bsize, pool, ctx)
            new_seg = (addr, bsize)
            self.seg_of[addr] = addr
        rest = bsize - size
        if rest >= _MIN_BLOCK if pool == SMALL else rest > _SMALL_SIZE:
            self.seg_of[addr + size] = self.seg_of[addr]
            self._add_free(addr + size, rest, pool)
            bsize = size
        self.size[addr] = bsize
        self.used[addr] = (request, ctx)
        return new_seg, addr

    def free(self, addr: int) -> None:
        """Free the block at ``addr``, merged with its free neighbours in the same segment."""
        del self.used[addr]
        seg = self.seg_of[addr]
        pool = self.segs[seg][1]
        size = self.size[addr]
        nxt = addr + size
        if nxt in self.size and nxt not in self.used and self.seg_of.get(nxt) == seg:
            nsize = self.size.pop(nxt)
            self._del_free(nxt, nsize, pool)
            del self.seg_of[nxt]
            size += nsize
        prev = self.free_end.get(addr)
        if prev is not None and self.seg_of.get(prev) == seg:
            psize = self.size[prev]
            self._del_free(prev, psize, pool)
            del self.size[addr], self.seg_of[addr]
            addr, size = prev, psize + size
        self._add_free(addr, size, pool)

    def empty_cache(self) -> list[tuple[int, int]]:
        """Release every segment with nothing allocated in it: their (address, size)."""
        out = []
        for pool, lst in self.free_lists.items():
            for size, addr in list(lst):
                seg = self.segs.get(addr)
                if seg is not None and seg[0] == size:
                    self._del_free(addr, size, pool)
                    del self.segs[addr], self.size[addr], self.seg_of[addr]
                    out.append((addr, size))
        return sorted(out)

    def segments(self) -> list[tuple[int, int, str, object, list[tuple[int, int, int, object]]]]:
        """Each segment by address: (address, size, pool, ctx, blocks as (address, size, requested bytes
        or 0 when free, ctx or None))."""
        by_seg: dict[int, list[int]] = {}
        for addr, seg in self.seg_of.items():
            by_seg.setdefault(seg, []).append(addr)
        out = []
        for seg in sorted(self.segs):
            size, pool, ctx = self.segs[seg]
            blocks = []
            for addr in sorted(by_seg.get(seg, ())):
                req, bctx = self.used.get(addr, (0, None))
                blocks.append((addr, self.size[addr], req, bctx))
            out.append((seg, size, pool, ctx, blocks))
        return out
