"""Free list over one slab's fixed-size slots.

Not a ring buffer: GC reclaims arbitrary slots, so a LIFO free stack hands them out again in O(1).
Memory is flat at millions of slots: 1 byte per slot for the occupancy map (bytearray) and 8 bytes per free
slot for the stack (array('q')); no Python int objects per slot.

Not thread-safe, by design: the store's writer thread is the only owner of a slab's pool (it allocates on spill
and frees on GC/free), so no lock is taken on the hot path. Other threads must go through the writer.
"""

from __future__ import annotations

from array import array
from typing import Iterable

import numpy as np


class SlotPoolError(RuntimeError):
    """A caller broke the pool's contract (double free, slot out of range, bad rebuild set)."""


class SlotPool:
    """Invariant: a slot below :attr:`limit` is either in the free stack exactly once or marked allocated, never
    both; a slot at or above the limit is never handed out (it may still be allocated: a page kept from before the
    limit shrank, see the store's slab beside an older geometry).

    ``limit`` (default: every slot) is the pool's capacity: the slots the budget lets this slab use right now. It
    only grows (:meth:`grow_to`), as another slab of the same budget gives its space back."""

    def __init__(self, num_slots: int, limit: "int | None" = None) -> None:
        if not isinstance(num_slots, int) or isinstance(num_slots, bool) or num_slots <= 0:
            raise SlotPoolError(f"num_slots must be a positive int, got {num_slots!r}")
        self._total = num_slots
        self._limit = self._check_limit(num_slots if limit is None else limit)
        self._allocated = bytearray(num_slots)
        self._free = array("q")
        self.reset()

    def _check_limit(self, limit) -> int:
        if not isinstance(limit, (int, np.integer)) or isinstance(limit, bool) or not 0 <= limit <= self._total:
            raise SlotPoolError(f"limit {limit!r} out of range [0, {self._total}]")
        return int(limit)

    @property
    def total(self) -> int:
        return self._total

    @property
    def limit(self) -> int:
        """Slots this pool may hand out (its capacity)."""
        return self._limit

    def grow_to(self, limit: int) -> int:
        """Raise the capacity to ``limit`` (never lowers it): the free slots in between join the free stack, the
        lowest handed out first. Returns the slots added."""
        limit = self._check_limit(limit)
        if limit <= self._limit:
            return 0
        new = np.arange(limit - 1, self._limit - 1, -1, dtype=np.int64)
        occupied = np.frombuffer(self._allocated, dtype=np.uint8)[self._limit:limit][::-1].astype(bool)
        add = new[~occupied]
        # Lowest first: the new (higher) free slots go below the existing stack's top.
        stack = array("q")
        stack.frombytes(np.ascontiguousarray(add, dtype=np.int64).tobytes())
        stack.extend(self._free)
        self._free = stack
        self._limit = limit
        return int(add.size)

    @property
    def free_count(self) -> int:
        return len(self._free)

    @property
    def used(self) -> int:
        """Slots holding a page (also any above the limit)."""
        return self._used

    def _check_range(self, slot: int) -> None:
        if not isinstance(slot, (int, np.integer)) or isinstance(slot, bool) or not 0 <= slot < self._total:
            raise SlotPoolError(f"slot {slot!r} out of range [0, {self._total})")

    def is_allocated(self, slot: int) -> bool:
        self._check_range(slot)
        return bool(self._allocated[slot])

    def alloc(self) -> "int | None":
        """A free slot, or None when the pool is full (the caller drops the spill and counts it)."""
        if not self._free:
            return None
        slot = self._free.pop()
        self._allocated[slot] = 1
        self._used += 1
        return slot

    def free(self, slot: int) -> None:
        """Give a slot back. Returns nothing; a slot at or above the limit stays out of the free stack."""
        self._check_range(slot)
        if not self._allocated[slot]:
            raise SlotPoolError(f"double free of slot {slot}")
        self._allocated[slot] = 0
        self._used -= 1
        if slot < self._limit:
            self._free.append(int(slot))

    def reset(self) -> None:
        """All slots free; the lowest slot is handed out first (keeps a fresh slab's writes sequential)."""
        self._allocated[:] = bytes(self._total)
        self._used = 0
        self._set_free_stack(np.arange(self._limit - 1, -1, -1, dtype=np.int64))

    def rebuild_from_allocated(self, slots: Iterable[int]) -> None:
        """Replace the whole state: exactly ``slots`` allocated, every other slot free. O(num_slots), vectorised.

        Cold start (``load``) calls this with the slots the durable index still points at, so none of them is
        ever handed out again. Duplicates or out-of-range slots mean the index and slab disagree: loud.
        """
        if isinstance(slots, np.ndarray):
            if slots.dtype.kind not in "iu":
                raise SlotPoolError(f"rebuild: slot array must be integers, got {slots.dtype}")
            live = slots.astype(np.int64, copy=False).ravel()
        elif isinstance(slots, range):
            live = np.arange(slots.start, slots.stop, slots.step, dtype=np.int64)
        else:
            live = np.fromiter((int(s) for s in slots), dtype=np.int64)
        if live.size:
            lo, hi = int(live.min()), int(live.max())
            if lo < 0 or hi >= self._total:
                bad = lo if lo < 0 else hi
                raise SlotPoolError(f"rebuild: slot {bad} out of range [0, {self._total})")
        counts = np.bincount(live, minlength=self._total)
        if live.size and int(counts.max()) > 1:
            dup = int(np.flatnonzero(counts > 1)[0])
            raise SlotPoolError(f"rebuild: slot {dup} listed more than once")
        occupied = counts.astype(bool)
        self._allocated[:] = occupied.astype(np.uint8).tobytes()
        self._used = int(live.size)
        self._set_free_stack(np.flatnonzero(~occupied[:self._limit])[::-1].astype(np.int64))

    def _set_free_stack(self, free_desc: np.ndarray) -> None:
        stack = array("q")
        stack.frombytes(np.ascontiguousarray(free_desc, dtype=np.int64).tobytes())
        self._free = stack

    def __repr__(self) -> str:
        return f"SlotPool(total={self._total}, limit={self._limit}, used={self.used})"
