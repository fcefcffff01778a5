"""l3/engine/reclaim.py: every way a slot comes back (GC, free, a reader's verify failure, clear) deletes the index
entry, and commits the delete, before the slot is reused; deletes are conditional (a verify failure deletes only
the exact entry the reader saw, GC keeps a page another rank touched since, nothing frees another rank's slot); GC
is a page-level LRU between watermarks, bounded per round, touched pages survive.

Through the store, then the Collector alone over a real index (``Rank``)."""

import itertools

import numpy as np
import pytest

import l3kit
from l3kit import K, NS
from sglang_glm_ext.l3.disk.format import slot_bytes_for
from sglang_glm_ext.l3.engine.counters import Counters
from sglang_glm_ext.l3.engine.index import IndexEntry, KeySpace, L3Index, Refusal, deployment_tag
from sglang_glm_ext.l3.engine.kinds import KindDisks, KindState, PageLRU
from sglang_glm_ext.l3.engine.reclaim import Collector
from sglang_glm_ext.l3.engine.slot_pool import SlotPool
from sglang_glm_ext.l3.engine.store import L3Store

PB = 4096
SLOT = slot_bytes_for(PB)


def key(i):
    return l3kit.key(i, "g")


def page(i):
    return l3kit.page(i, "g", nbytes=PB)


def open_store(tmp_path, slots=20, start=0.9, stop=0.5, budget=64):
    c = l3kit.config(tmp_path, budget=slots * SLOT, deployment=None,
                     gc={"start": start, "stop": stop, "budget_per_round": budget}, queues={"write_batch_pages": 1})
    return L3Store.open(c, rank=0, namespace=NS, page_bytes={K: PB})


def spill(s, i):
    assert s.spill(K, [key(i)], [page(i)]) == [True]
    assert s.flush(30)


def test_gc_reclaims_coldest_down_to_stop_watermark(tmp_path):
    s = open_store(tmp_path)
    try:
        for i in range(18):  # 18/20 = 0.90 -> start watermark reached on the 18th page
            spill(s, i)
        s.flush(30)
        st = s.stats()
        # Reclaimed down to stop (0.5 * 20 = 10 slots), oldest first; no slot leaked.
        assert st["slots"]["target_kv"]["used"] == 10
        assert st["gc_reclaimed"] == 8
        present = [s.exists(K, [key(i)]) for i in range(18)]
        assert present == [0] * 8 + [1] * 10
    finally:
        s.close()


def test_gc_does_not_run_below_start_watermark(tmp_path):
    s = open_store(tmp_path)
    try:
        for i in range(17):  # 0.85 < 0.90
            spill(s, i)
        assert s.stats()["gc_reclaimed"] == 0 and s.stats()["slots"]["target_kv"]["used"] == 17
    finally:
        s.close()


def test_reload_touch_keeps_a_hot_page(tmp_path):
    s = open_store(tmp_path)
    try:
        for i in range(10):
            spill(s, i)
        dst = np.zeros(PB, np.uint8)
        assert s.reload_into(K, [key(0)], [dst]) == [True]  # page 0 becomes the most recent
        assert s.flush(30)
        for i in range(10, 18):
            spill(s, i)
        assert s.flush(30)
        assert s.exists(K, [key(0)]) == 1  # survived although it was spilled first
        assert s.exists(K, [key(1)]) == 0  # the next-coldest went instead
    finally:
        s.close()


def test_gc_work_per_round_is_bounded(tmp_path):
    s = open_store(tmp_path, budget=1)
    calls = []
    real = s.index.delete_if

    def spy(items, **kw):
        calls.append(len(items))
        return real(items, **kw)

    s.index.delete_if = spy
    try:
        for i in range(18):
            spill(s, i)
        assert s.flush(30)
        assert calls and max(calls) == 1  # one victim per round, never a burst
    finally:
        s.close()


def test_reclaim_commits_index_delete_before_freeing_the_slot(tmp_path):
    s = open_store(tmp_path)
    events = []
    real_delete = s.index.delete_if
    pool = s.diagnostics().home(K).pool
    real_free = pool.free

    def delete_spy(items, **kw):
        res = real_delete(items, **kw)
        for (ikey, _), r in zip(items, res):
            # Record only once the transaction has committed: a reader can no longer find the entry.
            assert s.index.get(ikey) is None or r is not True
            events.append(("deleted", ikey))
        return res

    def free_spy(slot):
        events.append(("freed", slot))
        return real_free(slot)

    s.index.delete_if = delete_spy
    pool.free = free_spy
    try:
        for i in range(18):
            spill(s, i)
        assert s.flush(30)
        assert s.stats()["gc_reclaimed"] == 8
        first_free = next(i for i, e in enumerate(events) if e[0] == "freed")
        first_delete = next(i for i, e in enumerate(events) if e[0] == "deleted")
        assert first_delete < first_free
    finally:
        s.close()


def test_racing_reader_of_a_reclaimed_slot_sees_a_miss(tmp_path, monkeypatch):
    """A reader holds an index entry; GC reclaims it and the slot is rewritten with another page before the
    read happens: verification turns it into a miss, never the other page's bytes."""
    from sglang_glm_ext.l3.engine import reload as reload_mod

    s = open_store(tmp_path, slots=20)
    try:
        spill(s, 0)
        stale = s.diagnostics().entry(K, key(0))
        s.free(K, [key(0)])
        assert s.flush(30)
        spill(s, 1)  # LIFO pool: page 1 lands in page 0's old slot
        now = s.diagnostics().entry(K, key(1))
        assert now.slot == stale.slot
        real_get_many, real_blames, reasons = s.index.get_many, reload_mod.blames_entry, []
        monkeypatch.setattr(s.index, "get_many", lambda keys: [stale])  # the reader's snapshot from before the free
        monkeypatch.setattr(reload_mod, "blames_entry", lambda why: reasons.append(why) or real_blames(why))
        ok = s.reload_into(K, [key(0)], [np.zeros(PB, np.uint8)])
        monkeypatch.setattr(s.index, "get_many", real_get_many)
        assert ok == [False] and reasons == ["hash_mismatch"]
    finally:
        s.close()


# Issue 7, item 6: memory the store keeps per page is bounded by the live pages, not by the number of reload hits.
def test_reload_hits_below_the_watermark_keep_the_gc_heap_bounded_by_live_pages(tmp_path):
    s = open_store(tmp_path, stop=0.75)  # 20 slots: at 18 used, GC reclaims the 3 coldest
    try:
        for i in range(4):
            spill(s, i)
        keys = [key(i) for i in range(4)]
        dsts = [np.zeros(PB, np.uint8) for _ in keys]
        for _ in range(1000):  # 4,000 hits on four pages, far below gc.start
            assert s.reload_into(K, keys, dsts) == [True] * 4
        assert s.flush(30)
        st = s.stats()
        assert st["gc_reclaimed"] == 0 and st["reload_hits"] == 4000
        assert st["gc_heap_items"] <= 2 * 4 + 64  # before: one heap item per hit (~4,000)
        # The LRU order is still right after compactions: of the four, the page touched last is the warmest.
        assert s.reload_into(K, [key(0)], [dsts[0]]) == [True]
        assert s.flush(30)
        for i in range(4, 18):
            spill(s, i)
        assert s.stats()["gc_reclaimed"] == 3
        assert [s.exists(K, [key(i)]) for i in range(4)] == [1, 0, 0, 0]
    finally:
        s.close()


def test_a_stale_verify_failure_never_deletes_a_newer_entry_for_the_same_slot(tmp_path, monkeypatch):
    """Found by reading: a reader looks up X (entry E1 at slot s), X is freed and stored again into the same
    slot (entry E2: same location, newer commit), and the reader's read of s is torn. Its verify failure names
    E1; the reclaim matched on location only, so it deleted E2, a valid durable page."""
    from sglang_glm_ext.l3.disk.slab_reader import SlabReader

    store = open_store(tmp_path)
    try:
        spill(store, 7)
        e1 = store.diagnostics().entry(K, key(7))
        store.free(K, [key(7)])
        assert store.flush(30)
        spill(store, 7)  # LIFO pool: the same slot again
        e2 = store.diagnostics().entry(K, key(7))
        assert e2.slot == e1.slot and e2.last_access > e1.last_access

        real_get_many, real_read = store.index.get_many, SlabReader.read_spans
        monkeypatch.setattr(store.index, "get_many", lambda keys: [e1])  # the reader's snapshot from before the free

        def torn(self, slot, spans, plan, bounce, **kw):
            got = real_read(self, slot, spans, plan, bounce, **kw)
            view, at = spans.views[0], spans.starts[0] + 5
            view[at] ^= 0xFF  # read raced a rewrite: the payload checksum fails
            return got

        monkeypatch.setattr(SlabReader, "read_spans", torn)
        assert store.reload_into(K, [key(7)], [np.zeros(PB, np.uint8)]) == [False]
        monkeypatch.setattr(store.index, "get_many", real_get_many)
        monkeypatch.setattr(SlabReader, "read_spans", real_read)
        assert store.flush(30)
        assert store.stats()["verify_failures"] == 1
        assert store.diagnostics().entry(K, key(7)) == e2  # the newer entry survived
        out = np.zeros(PB, np.uint8)
        assert store.reload_into(K, [key(7)], [out]) == [True] and np.array_equal(out, page(7))
        # A verify failure against the CURRENT entry still reclaims it (the slot really holds bad bytes).
        monkeypatch.setattr(SlabReader, "read_spans", torn)
        assert store.reload_into(K, [key(7)], [np.zeros(PB, np.uint8)]) == [False]
        monkeypatch.setattr(SlabReader, "read_spans", real_read)
        assert store.flush(30)
        assert store.exists(K, [key(7)]) == 0 and store.stats()["slots"]["target_kv"]["used"] == 0
    finally:
        store.close()


# ---------------------------------------------------------------------------------------------- the Collector alone
class Rank:
    """One kind of rank 0 on disk 0 over a real index: ``n`` durable pages in slots 0..n-1, coldest first, and the
    Collector that reclaims them. ``events`` records, in order, every index delete that committed and every slot
    that went back to the pool, with the entries naming that slot in the index at that moment."""

    def __init__(self, tmp_path, n=6, **gc):
        self.cfg = l3kit.config(tmp_path, budget=64 * SLOT, gc={"start": 0.9, "stop": 0.5, **gc})
        self.index = L3Index.open(str(tmp_path / "index"), 2**24)
        self.space = KeySpace(deployment_tag("t"), NS.digest())
        self.pool = SlotPool(64)
        self.st = KindState(kind=K, page_bytes=PB, slot_bytes=SLOT, num_slots=64, slab=None, pool=self.pool,
                            lru=PageLRU(itertools.count(1)))
        self.keys = [self.space.key(K, bytes.fromhex(key(i))) for i in range(n)]
        for i, k in enumerate(self.keys):
            assert self.pool.alloc() == i
            self.index.put(k, IndexEntry(0, 0, i, 10 + i))
            self.st.lru.record(k, 10 + i, i)
        self.counters = Counters()
        self.c = Collector(self.cfg, self.index, {K: KindDisks([self.st])}, rank=0, namespace=NS.digest(),
                           counters=self.counters)
        self.events = []
        real_delete, real_free = self.index.delete_if, self.pool.free

        def delete_if(items, **kw):
            res = real_delete(items, **kw)
            self.events += [("deleted", k) for (k, _), r in zip(items, res or ()) if r is True]
            return res

        def free(slot):
            self.events.append(("freed", slot, self.naming(slot)))
            return real_free(slot)

        self.index.delete_if, self.pool.free = delete_if, free

    def naming(self, slot):
        """Keys whose entry in the index names ``slot`` of rank 0, disk 0."""
        return [k for k, e in zip(self.keys, self.index.get_many(self.keys))
                if e is not None and e.same_location(IndexEntry(0, 0, slot, 0))]

    def entry(self, i):
        return self.index.get(self.keys[i])

    def close(self):
        self.index.close()


@pytest.fixture
def rank(tmp_path):
    r = Rank(tmp_path)
    yield r
    r.close()


def test_gc_free_and_a_verify_failure_each_delete_the_entry_before_the_slot_goes_back(rank):
    assert rank.c.reclaim_coldest(rank.st, 2) == 2  # GC: the two coldest
    rank.c.free(K, [rank.keys[4]])  # a caller's free
    rank.c.reclaim(K, [(rank.keys[5], rank.entry(5))], exact=True)  # a reader's verify failure
    freed = [e for e in rank.events if e[0] == "freed"]
    assert [slot for _, slot, _ in freed] == [0, 1, 4, 5]
    assert all(naming == [] for _, _, naming in freed)  # no entry named the slot when it went back
    for _, slot, _ in freed:  # and each delete committed before its slot was freed
        k = rank.keys[slot]
        assert rank.events.index(("deleted", k)) < rank.events.index(("freed", slot, []))
    assert rank.pool.used == 2 and set(rank.st.lru.current) == {rank.keys[2], rank.keys[3]}
    assert rank.counters.gc_reclaimed == 2 and rank.counters.freed == 1


def test_a_verify_failure_deletes_only_the_exact_entry_the_reader_saw(rank):
    seen = rank.entry(3)  # the reader's entry; the page is then freed and committed again into the same slot
    newer = IndexEntry(0, 0, 3, seen.last_access + 5)
    rank.index.put(rank.keys[3], newer)
    rank.st.lru.record(rank.keys[3], newer.last_access, 3)
    rank.c.reclaim(K, [(rank.keys[3], seen)], exact=True)
    assert rank.entry(3) == newer and rank.pool.is_allocated(3) and rank.keys[3] in rank.st.lru.current
    rank.c.reclaim(K, [(rank.keys[3], newer)], exact=True)  # a verify failure of the current entry reclaims it
    assert rank.entry(3) is None and not rank.pool.is_allocated(3) and rank.keys[3] not in rank.st.lru.current


def test_a_page_another_rank_touched_since_is_kept_and_warm_again(rank):
    coldest = rank.entry(0)
    rank.index.put(rank.keys[0], coldest._replace(last_access=1000))  # another rank's reload touched it
    assert rank.c.reclaim_coldest(rank.st, 1) == 0
    assert rank.entry(0).last_access == 1000 and rank.pool.is_allocated(0)
    assert rank.st.lru.current[rank.keys[0]] == (1000, 0)  # the LRU took the newer time: now the warmest
    assert rank.c.reclaim_coldest(rank.st, 1) == 1 and rank.entry(1) is None  # the next-coldest goes instead


def test_a_refused_delete_frees_nothing_keeps_the_pages_and_backs_off(rank, monkeypatch):
    def refused(items, **kw):
        rank.index.last_refusal = Refusal(True, "MapFullError: injected")
        return None

    monkeypatch.setattr(rank.index, "delete_if", refused)
    assert rank.c.reclaim_coldest(rank.st, 2) == 0
    assert rank.pool.used == 6 and len(rank.st.lru.current) == 6 and rank.counters.index_full == 1
    assert rank.c.backing_off() and not rank.c.gc_active() and 0 < rank.c.retry_in() <= 0.05
    monkeypatch.undo()
    rank.c._retry_at = 0.0  # the pause is over
    assert rank.c.reclaim_coldest(rank.st, 2) == 2 and rank.entry(0) is None and rank.entry(1) is None
    assert not rank.c.backing_off() and rank.c.retry_in() is None


def test_deleting_an_entry_of_another_rank_frees_no_slot_of_this_one(rank):
    other = IndexEntry(1, 0, 2, 99)  # rank 1's page whose slot number is one of ours
    rank.index.put(rank.keys[2], other)
    rank.c.reclaim(K, [(rank.keys[2], other)])
    assert rank.entry(2) is None and rank.pool.is_allocated(2)

