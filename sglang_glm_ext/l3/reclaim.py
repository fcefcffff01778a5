"""Every way a slot comes back to its pool, run on the writer thread: GC, ``free``, a reader's verify failure,
``clear``.

Invariant (l3_design.md, crash-safety point 2): the index entry is deleted, and the delete committed, BEFORE the
slot goes back to the pool. A reader that looked the entry up earlier then reads either the old blob or one whose
header names a different page (a miss), never another page's bytes. Deletes are conditional on the entry still
naming the same (rank, disk, slot), so one rank never deletes another rank's newer entry.

GC is a page-level LRU per kind between watermarks: ``pool.used / total >= gc.start`` activates it; each round
reclaims at most ``gc.budget_per_round`` of the coldest pages until ``used <= gc.stop``.
"""

from __future__ import annotations

import time
from typing import Mapping

from .config import L3Config
from .counters import Counters
from .format import PayloadKind
from .health import Health
from .index import IndexEntry, L3Index, split_key
from .kinds import KindState

__all__ = ["Collector"]

_BACKOFF_MIN_S = 0.05
_BACKOFF_MAX_S = 2.0


class Collector:
    """The writer's reclaims for one rank. Touches only the pools and LRUs of ``kinds`` (writer-owned)."""

    def __init__(self, config: L3Config, index: L3Index, kinds: Mapping[PayloadKind, KindState], *, rank: int,
                 disk: int, namespace: bytes, counters: Counters, health: "Health | None" = None):
        self.config = config
        self.index = index
        self.kinds = kinds
        self.rank = rank
        self.disk = disk
        self.namespace = namespace
        self.c = counters
        self.health = health or Health(rank)
        # An index that refuses deletes (a full disk) is retried after a growing pause, not every writer pass.
        self._retry_at = 0.0
        self._backoff = 0.0

    # ------------------------------------------------------------------ index refusals
    def backing_off(self) -> bool:
        """The index refused a reclaim a moment ago: GC waits until :meth:`retry_in` has passed."""
        return bool(self._retry_at) and time.monotonic() < self._retry_at

    def retry_in(self) -> "float | None":
        """Seconds until GC may try the index again (None: no pause in force)."""
        if not self._retry_at:
            return None
        return max(0.0, self._retry_at - time.monotonic())

    def _refused(self) -> None:
        why = self.index.last_refusal
        if why is None or why.full:
            self.c.index_full += 1
        self.health.index.failed(why or "index map full")
        self._backoff = min(max(2 * self._backoff, _BACKOFF_MIN_S), _BACKOFF_MAX_S)
        self._retry_at = time.monotonic() + self._backoff

    def _worked(self) -> None:
        self._backoff = self._retry_at = 0.0

    # ------------------------------------------------------------------ GC
    def gc_active(self) -> bool:
        return not self.backing_off() and any(st.lru.active for st in self.kinds.values())

    def round(self) -> int:
        """One bounded GC round per pool over its start watermark. Returns pages reclaimed."""
        cfg = self.config
        n = 0
        for st in self.kinds.values():
            used = st.pool.used / st.num_slots
            if not st.lru.active and used >= cfg.gc_start:
                st.lru.active = True
            if st.lru.active:
                target = int(cfg.gc_stop * st.num_slots)
                n += self.reclaim_coldest(st, min(cfg.gc_budget_per_round, max(0, st.pool.used - target)))
                if st.pool.used <= target or not st.lru.current:
                    st.lru.active = False
        return n

    def until_below_watermarks(self) -> None:
        """Bounded rounds until every pool is back under its watermark (a flush barrier)."""
        for _ in range(1_000_000):
            if not self.gc_active() or not self.round():
                break

    def reclaim_coldest(self, st: KindState, budget: int) -> int:
        """Reclaim up to ``budget`` of the coldest pages. Index delete commits before any slot is freed."""
        victims = [(key, IndexEntry(self.rank, self.disk, slot, la)) for key, la, slot in st.lru.pop_coldest(budget)]
        if not victims:
            return 0
        res = self.index.delete_if(victims, newer_than_wins=True)
        if res is None:  # could not commit: keep them, try again after a pause
            for key, e in victims:
                st.lru.push(e.last_access, key, e.slot)
            self._refused()
            return 0
        self._worked()
        n = 0
        for (key, e), r in zip(victims, res):
            if isinstance(r, IndexEntry):  # another rank touched it since: it is warm, keep it
                st.lru.record(key, r.last_access, e.slot)
                continue
            # True: deleted now. False: the entry is gone or names another location, so our slot is unreferenced.
            del st.lru.current[key]
            st.pool.free(e.slot)
            n += 1
        self.c.gc_reclaimed += n
        return n

    # ------------------------------------------------------------------ free / verify failure
    def free(self, kind: PayloadKind, keys) -> None:
        entries = self.index.get_many(keys)
        self.reclaim(kind, [(k, e) for k, e in zip(keys, entries) if e is not None], freed=True)

    def reclaim(self, kind: PayloadKind, items: list[tuple[bytes, IndexEntry]], *, freed: bool = False,
                exact: bool = False) -> None:
        """Conditionally delete entries (same location; ``exact``: same entry), commit, THEN free our slots."""
        if not items:
            return
        res = self.index.delete_if(items, exact=exact)
        if res is None:
            self._refused()
            return
        self._worked()
        st = self.kinds[kind]
        for (key, e), deleted in zip(items, res):
            if deleted is not True:
                continue
            if freed:
                self.c.freed += 1
            if e.rank == self.rank and e.disk == self.disk:
                cur = st.lru.current.pop(key, None)
                if cur is not None and cur[1] == e.slot:
                    st.pool.free(e.slot)
                elif cur is not None:
                    st.lru.current[key] = cur

    # ------------------------------------------------------------------ clear
    def keep_only(self, entries: list[tuple[bytes, IndexEntry]]) -> None:
        """Every pool, LRU map and heap := exactly the given entries of this rank that name this disk (a clear, or
        what survived a failed one). Entries of another namespace keep their slot allocated without joining the
        GC (reclaimed at the next cold start, which drops other namespaces)."""
        by_kind: dict[int, list[tuple[bytes, IndexEntry]]] = {int(k): [] for k in self.kinds}
        for key, e in entries:
            at = by_kind.get(split_key(key).kind)
            if at is not None:
                at.append((key, e))
        for st in self.kinds.values():
            live, current = set(), {}
            for key, e in by_kind[int(st.kind)]:
                if e.disk != self.disk or not 0 <= e.slot < st.num_slots or e.slot in live:
                    continue
                live.add(e.slot)
                if split_key(key).namespace == self.namespace:
                    current[key] = (e.last_access, e.slot)
            st.pool.rebuild_from_allocated(sorted(live))
            st.lru.reset(current)
