"""Every way a slot comes back to its pool, run on the writer thread: GC, ``free``, a reader's verify failure,
``clear``.

Invariant (l3_design.md, crash-safety point 2): the index entry is deleted, and the delete committed, BEFORE the
slot goes back to the pool. A reader that looked the entry up earlier then reads either the old blob or one whose
header names a different page (a miss), never another page's bytes. Deletes are conditional on the entry still
naming the same (rank, disk, slot), so one rank never deletes another rank's newer entry.

GC is a page-level LRU per kind between watermarks: ``pool.used / total >= gc.start`` activates it; each round
reclaims at most ``gc.budget_per_round`` of the coldest pages until ``used <= gc.stop``. A rank with several
disks has a pool per (kind, disk), each with its own watermarks: a disk's pages are reclaimed to make room on that
disk (its index entries name it), and a failing disk's pool simply stops filling.
"""

from __future__ import annotations

import time
from typing import Mapping

from ..config import L3Config
from .counters import Counters
from ..disk.format import PayloadKind
from .health import Health
from .index import IndexEntry, L3Index, split_key
from .kinds import KindDisks, KindState
from .slab_set import settle

__all__ = ["Collector"]

_BACKOFF_MIN_S = 0.05
_BACKOFF_MAX_S = 2.0


class Collector:
    """The writer's reclaims for one rank. Touches only the pools and LRUs of ``kinds`` (writer-owned)."""

    def __init__(self, config: L3Config, index: L3Index, kinds: Mapping[PayloadKind, KindDisks], *, rank: int,
                 namespace: bytes, counters: Counters, health: "Health | None" = None):
        self.config = config
        self.index = index
        self.kinds = kinds
        self.rank = rank
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
    def states(self):
        """Every (kind, disk) pool of the rank."""
        return [st for grp in self.kinds.values() for st in grp.parts]

    def gc_active(self) -> bool:
        return not self.backing_off() and any(st.lru.active for st in self.states())

    def round(self) -> int:
        """One bounded GC round per pool over its start watermark. Returns pages reclaimed. The watermarks are of the
        pool's capacity (``pool.limit``); beside slabs of other page sizes a pool with no capacity yet is full."""
        cfg = self.config
        n = 0
        for st in self.states():
            cap = st.pool.limit
            used = st.pool.used / cap if cap else (1.0 if st.retired else 0.0)
            if not st.lru.active and used >= cfg.gc_start:
                st.lru.active = True
            if st.lru.active:
                target = int(cfg.gc_stop * cap)
                want = st.pool.used - target if cap else cfg.gc_budget_per_round
                n += self.reclaim_coldest(st, min(cfg.gc_budget_per_round, max(1, want)))
                cap = st.pool.limit
                if (cap and st.pool.used <= int(cfg.gc_stop * cap)) or not (st.lru.current or st.retired):
                    st.lru.active = False
        return n

    def until_below_watermarks(self) -> None:
        """Bounded rounds until every pool is back under its watermark (a flush barrier)."""
        for _ in range(1_000_000):
            if not self.gc_active() or not self.round():
                break

    def reclaim_coldest(self, st: KindState, budget: int) -> int:
        """Reclaim up to ``budget`` of the coldest pages of the kind, whatever their namespace or slab (this slab and
        the retired ones of other page sizes, slab_set.py). Index delete commits before any slot is freed or
        punched; a retired slab's reclaimed slots go back to the file system and this slab's capacity grows by
        the space they held."""
        sources = [(st.lru, None), *((r.lru, r) for r in st.retired)]
        cands = [(la, key, slot, lru, r) for lru, r in sources for key, la, slot in lru.pop_coldest(budget)]
        if len(sources) > 1:
            cands.sort(key=lambda c: c[0])
            for la, key, slot, lru, _ in cands[budget:]:
                lru.push(la, key, slot)  # not this round: back in its heap (still live in its map)
            cands = cands[:budget]
        if not cands:
            return 0
        res = self.index.delete_if([(key, IndexEntry(self.rank, st.disk, slot, la)) for la, key, slot, _, _ in cands],
                                   newer_than_wins=True)
        if res is None:  # could not commit: keep them, try again after a pause
            for la, key, slot, lru, _ in cands:
                lru.push(la, key, slot)
            self._refused()
            return 0
        self._worked()
        n = 0
        punch: dict[int, tuple] = {}
        for (la, key, slot, lru, r), got in zip(cands, res):
            if isinstance(got, IndexEntry):  # another rank touched it since: it is warm, keep it
                lru.record(key, got.last_access, slot)
                continue
            # True: deleted now. False: the entry is gone or names another location, so our slot is unreferenced.
            del lru.current[key]
            n += 1
            if r is None:
                st.pool.free(slot)
                if slot >= st.pool.limit:  # a page kept past the capacity: its blocks go back too
                    punch.setdefault(id(st), (st.slab, []))[1].append(slot)
            else:
                punch.setdefault(id(r), (r.slab, []))[1].append(slot)
        self.c.gc_reclaimed += n
        for slab, slots in punch.values():
            slab.punch(slots)
        if st.retired:
            self._settle(st)
        return n

    def _settle(self, st: KindState) -> None:
        """Emptied retired slabs go, and the capacity grows into the space they gave back (slab_set.settle)."""
        try:
            settle(st)
        except OSError as e:  # the reserve of the grown capacity failed (a full disk): it stays as it is
            self.health.slab_on(st.disk).failed(f"{st.kind.label}: reserving a grown capacity: {e}")

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
        grp = self.kinds[kind]
        for (key, e), deleted in zip(items, res):
            if deleted is not True:
                continue
            if freed:
                self.c.freed += 1
            st = grp.on(e.disk) if e.rank == self.rank else None
            if st is not None:
                cur = st.lru.current.pop(key, None)
                if cur is not None and cur[1] == e.slot:
                    st.pool.free(e.slot)
                elif cur is not None:
                    st.lru.current[key] = cur

    # ------------------------------------------------------------------ clear
    def keep_only(self, entries: list[tuple[bytes, IndexEntry]]) -> None:
        """Every pool, LRU map and heap := exactly the given entries of this rank that name one of its disks (a
        clear, or what survived a failed one), each on the slab it names (its disk's state, then
        ``KindState.slab_of``, as at a ``load``): that slab's pool and LRU, or a retired slab's LRU; then emptied
        retired slabs go and the capacity grows."""
        by_kind: dict[int, list[tuple[bytes, IndexEntry]]] = {int(k): [] for k in self.kinds}
        for key, e in entries:
            at = by_kind.get(split_key(key).kind)
            if at is not None:
                at.append((key, e))
        for st in self.states():
            live: dict[int, set] = {}
            current: dict[int, dict] = {}
            for key, e in by_kind[int(st.kind)]:
                if e.disk != st.disk:
                    continue
                target = st.slab_of(split_key(key).namespace, self.namespace)
                if target is None or not 0 <= e.slot < target.num_slots \
                        or e.slot in live.setdefault(id(target), set()):
                    continue
                live[id(target)].add(e.slot)
                current.setdefault(id(target), {})[key] = (e.last_access, e.slot)
            st.pool.rebuild_from_allocated(sorted(live.get(id(st), ())))
            st.lru.reset(current.get(id(st), {}))
            for r in st.retired:
                r.lru.reset(current.get(id(r), {}))
            if st.retired:
                self._settle(st)
