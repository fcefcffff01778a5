"""One payload kind of a rank: its geometry and slab (fixed at open) and what the writer thread owns for it.

A rank with several disks (``ranks.mapping`` entry ``[0, 1, ...]``) has one :class:`KindState` per (kind, disk): its
own slab, slot pool, LRU and retired slabs on that disk, sized by its share of that disk. :class:`KindDisks` holds a
kind's states, home disk first, and says on which of them a new page goes (:meth:`KindDisks.preferred`). A one-disk
rank has one state per kind, as before.

The writer thread is the only one that touches ``pool``, ``lru`` and ``retired`` once it runs (no lock on any);
the cold start fills them before the writer exists. Every other thread reads only the fixed fields.

Several geometries under one budget: a slab of this kind with another slot size under the same
deployment and rank (an older model's, or one that takes turns with this one) is a :class:`RetiredSlab` here: its
pages stay (this store never writes it), GC reclaims them by the same LRU as this slab's pages, and the space they
hold counts against this kind's share of the budget, so this slab's capacity (``pool.limit``) is what they leave
(:meth:`KindState.grant`); it grows as they are reclaimed, and an emptied retired slab is deleted.
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass, field
from typing import Any, Iterator

from ..disk.format import PayloadKind
from .slot_pool import SlotPool

__all__ = ["KindState", "KindDisks", "PageLRU", "RetiredSlab", "HEAP_SLACK", "placement_bits"]

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
class RetiredSlab:
    """A slab of the kind with another slot size: its pages (``lru``, no pool: nothing is written into it) are
    reclaimed by GC; the slots it no longer needs are punched out of the file, and the file goes when it is empty."""

    path: str
    slab: Any  # disk.DiskSlab, opened with its own geometry (flock'ed: nobody else writes it meanwhile)
    slot_bytes: int
    num_slots: int
    namespaces: set  # namespace digests its sidecar lists: entries of those namespaces name this file
    lru: PageLRU
    usable: bool = True  # False: its sidecar or size cannot vouch for it: its entries are dropped, the file removed

    @property
    def held_bytes(self) -> int:
        """What it holds of the budget: its live pages (every other slot is punched out)."""
        return len(self.lru.current) * self.slot_bytes


@dataclass(eq=False)
class KindState:
    kind: PayloadKind
    page_bytes: int
    slot_bytes: int
    num_slots: int
    slab: Any  # disk.DiskSlab: this rank's writable slab of this kind
    pool: SlotPool
    lru: PageLRU  # every page of this slab, whatever its namespace (GC's order)
    retired: list = field(default_factory=list)  # RetiredSlab: the kind's slabs of other slot sizes
    namespaces: set = field(default_factory=set)  # namespaces this slab's sidecar lists (its entries map here)
    disk: int = 0  # the config's disk index this slab (and every retired one beside it) lives on

    def grant(self) -> int:
        """Slots of this slab the budget allows now: the kind's share minus what its retired slabs hold."""
        left = self.num_slots * self.slot_bytes - sum(r.held_bytes for r in self.retired)
        return max(0, min(self.num_slots, left // self.slot_bytes))

    def slab_of(self, ns: bytes, own: bytes) -> "RetiredSlab | KindState | None":
        """Which slab an entry of namespace ``ns`` names: this one for its own namespace (one namespace, one page
        size, one file) or one its sidecar lists; a retired slab that lists it; this one when there is no other
        slab. None: several slabs and none lists it (it cannot be placed: it is dropped, a miss)."""
        if ns == own or ns in self.namespaces:
            return self
        for r in self.retired:
            if ns in r.namespaces:
                return r
        return None if self.retired else self


def placement_bits(content_hash: bytes) -> int:
    """The bits of a page's key that choose its disk: bytes 8-16, not the first 8, which choose the page's writer
    among a node's ranks (hicache/cp_writers.py). With the same bits, every page one writer owns would satisfy
    ``h % n == r`` and, with as many disks as writers, land on one disk."""
    return int.from_bytes(content_hash[8:16], "little")


class KindDisks:
    """One payload kind's slabs on each of a rank's disks: a :class:`KindState` per disk, home disk first.

    Geometry (``kind``, ``page_bytes``, ``slot_bytes``) is the kind's, the same on every disk; what a page needs for
    its own slab is in the state of the disk its index entry names (:meth:`on`). Where a new page goes: the disk its
    content hash picks, each disk taking a share of the hash space in proportion to its slots (a disk with twice
    the budget fills at the same rate as the others, so their GC watermarks are reached together and eviction stays
    close to one LRU over the rank); the writer steps to the next disk when that one is failing or backed up
    (writer.py). The choice is a function of the key alone, so nothing about it needs to be stored: the index entry
    records where the page went."""

    def __init__(self, states: "list[KindState]"):
        if not states:
            raise ValueError("a kind needs at least one disk")
        self.parts: tuple[KindState, ...] = tuple(states)
        first = self.parts[0]
        self.kind, self.page_bytes, self.slot_bytes = first.kind, first.page_bytes, first.slot_bytes
        self._by_disk = {st.disk: st for st in self.parts}
        total = sum(st.num_slots for st in self.parts)
        acc, bounds = 0, []
        for st in self.parts[:-1]:
            acc += st.num_slots
            bounds.append((acc << 64) // total)
        self._bounds = bounds  # cumulative shares of [0, 2**64): disk i takes [bounds[i-1], bounds[i])

    @property
    def home(self) -> KindState:
        return self.parts[0]

    def on(self, disk: int) -> "KindState | None":
        """The kind's state on ``disk``, or None when this rank does not write that disk."""
        return self._by_disk.get(disk)

    def preferred(self, content_hash: bytes) -> int:
        """Index into :attr:`parts` of the disk a new page goes to when every disk takes pages."""
        if len(self.parts) == 1:
            return 0
        return bisect.bisect_right(self._bounds, placement_bits(content_hash))

    def __iter__(self):
        return iter(self.parts)

    def __len__(self) -> int:
        return len(self.parts)
