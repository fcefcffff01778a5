"""GC: page-level LRU on the writer thread between watermarks; touched pages survive; delete-before-free."""

import hashlib

import numpy as np

from sglang_glm_ext.l3.config import L3Config
from sglang_glm_ext.l3.format import Namespace, PayloadKind, slot_bytes_for
from sglang_glm_ext.l3.store import L3Store

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
    pool = s._kinds[K].pool
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
        ok, reason = s._reload_one(st, bytes.fromhex(key(0)), stale, np.zeros(PB, np.uint8), None, None)
        assert not ok and reason == "hash_mismatch"
    finally:
        s.close()
