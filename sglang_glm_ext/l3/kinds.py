"""One payload kind of a rank: its geometry and slab (fixed at open) and what the writer thread owns for it.

The writer thread is the only one that touches ``pool`` and ``lru`` once it runs (no lock on either); the cold
start fills them before the writer exists. Every other thread reads only the fixed fields.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any, Iterator

from .format import PayloadKind
from .slot_pool import SlotPool

__all__ = ["KindState", "PageLRU", "HEAP_SLACK"]

HEAP_SLACK = 64  # heap items allowed beyond 2x the live pages before a compaction


class PageLRU:
    """The pages this rank owns of one kind, coldest first: a lazy-deletion heap of ``(last_access, seq, key,
    slot)`` over the authoritative map ``current: key -> (last_access, slot)``.

    Invariant: ``len(heap) <= 2 * len(current) + HEAP_SLACK`` after every push, so the heap's memory is bounded
    by the live pages however many touches arrive below gc.start (where nothing pops). A compaction rebuilds the
    heap from ``current`` in O(live); it runs after at least live + slack pushes, so it costs O(1) amortised per
    push. ``seq`` (shared by the kinds of a store) orders pages of equal last_access by when they were pushed.
    """

    def __init__(self, seq: Iterator[int]):
        self.heap: list = []
        self.current: dict[bytes, tuple[int, int]] = {}
        self.active = False  # GC is reclaiming this kind (between the start and stop watermarks)
        self._seq = seq

    def record(self, key: bytes, last_access: int, slot: int) -> None:
        """``key`` lives in ``slot``, last used at ``last_access``."""
        self.current[key] = (last_access, slot)
        self.push(last_access, key, slot)

    def push(self, last_access: int, key: bytes, slot: int) -> None:
        heapq.heappush(self.heap, (last_access, next(self._seq), key, slot))
        if len(self.heap) > 2 * len(self.current) + HEAP_SLACK:
            self._reheap()

    def load(self, items) -> None:
        """Cold start: seed from the durable entries ``(key, last_access, slot)`` (hot pages stay hot)."""
        items = list(items)
        self.current.update({key: (last_access, slot) for key, last_access, slot in items})
        base = len(self.heap)
        self.heap.extend((la, base + i, key, slot) for i, (key, la, slot) in enumerate(items))
        heapq.heapify(self.heap)

    def reset(self, current: dict) -> None:
        """Exactly these pages (clear); GC idle."""
        self.current = current
        self._reheap()
        self.active = False

    def pop_coldest(self, budget: int) -> list[tuple[bytes, int, int]]:
        """Up to ``budget`` of the coldest live pages as ``(key, last_access, slot)``, taken off the heap (they stay
        in ``current`` until reclaimed). Stale heap items (touched, freed or reclaimed since) are dropped."""
        out = []
        while self.heap and len(out) < budget:
            la, _, key, slot = heapq.heappop(self.heap)
            if self.current.get(key) == (la, slot):
                out.append((key, la, slot))
        return out

    def _reheap(self) -> None:
        self.heap = [(la, next(self._seq), k, sl) for k, (la, sl) in self.current.items()]
        heapq.heapify(self.heap)


@dataclass(eq=False)
class KindState:
    kind: PayloadKind
    page_bytes: int
    slot_bytes: int
    num_slots: int
    slab: Any  # disk.DiskSlab: this rank's writable slab of this kind
    pool: SlotPool
    lru: PageLRU
