"""GC: page-level LRU on the writer thread between watermarks; touched pages survive; delete-before-free."""

import hashlib

import numpy as np

from sglang_glm_ext.l3.config import L3Config
from sglang_glm_ext.l3.disk.format import Namespace, PayloadKind, slot_bytes_for
from sglang_glm_ext.l3.engine.store import L3Store

PB = 4096
SLOT = slot_bytes_for(PB)
NS = Namespace("glm5", "bf16", "page_first", 64, 0, 78, "tp0")
K = PayloadKind.TARGET_KV


def key(i):
    return hashlib.sha256(f"g{i}".encode()).hexdigest()


def page(i):
    return np.full(PB, i % 251, np.uint8)


def open_store(tmp_path, slots=20, start=0.9, stop=0.5, budget=64):
    c = L3Config.from_dict({
        "disks": [{"path": str(tmp_path / "disk"), "budget": slots * SLOT}],
        "index": {"path": str(tmp_path / "index"), "map_size": 2**24},
        "gc": {"start": start, "stop": stop, "budget_per_round": budget},
        "queues": {"write_batch_pages": 1},
    })
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
    pool = s._kinds[K].home.pool
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


def test_racing_reader_of_a_reclaimed_slot_sees_a_miss(tmp_path):
    """A reader holds an index entry; GC reclaims it and the slot is rewritten with another page before the
    read happens: verification turns it into a miss, never the other page's bytes."""
    s = open_store(tmp_path, slots=20)
    try:
        spill(s, 0)
        stale = s.index.get(s._ikey(K, bytes.fromhex(key(0))))
        s.free(K, [key(0)])
        assert s.flush(30)
        spill(s, 1)  # LIFO pool: page 1 lands in page 0's old slot
        now = s.index.get(s._ikey(K, bytes.fromhex(key(1))))
        assert now.slot == stale.slot
        st = s._kinds[K]
        ok, reason = s._reloader.read_into(st, bytes.fromhex(key(0)), stale, np.zeros(PB, np.uint8))
        assert not ok and reason == "hash_mismatch"
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


def test_reload_hits_while_the_writer_is_stalled_do_not_queue_one_message_each(tmp_path):
    import os
    import threading

    s = open_store(tmp_path)
    gate = threading.Event()
    try:
        for i in range(4):
            spill(s, i)

        def stalled(fd, data, offset):
            gate.wait(30)
            return os.pwrite(fd, data, offset)

        s.slab(K).inject_write_fault(stalled)
        for i in range(10, 16):  # one write blocked in the I/O pool, two batches queued: the writer blocks
            s.spill(K, [key(i)], [page(i)])
        keys = [key(i) for i in range(4)]
        dsts = [np.zeros(PB, np.uint8) for _ in keys]
        for _ in range(500):
            assert s.reload_into(K, keys, dsts) == [True] * 4
        st = s.stats()
        assert st["control_queue_depth"] + st["pending_touches"] <= 4 + 8  # before: 2,000 queued touches
    finally:
        gate.set()
        s.slab(K).inject_write_fault(None)
        s.close()
