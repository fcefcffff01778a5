"""l3/engine/writer.py: the writer thread is the sole owner of every slot pool and page LRU; control operations
(free, clear, add_kind, flush barriers) are applied in the order they were posted and each is acknowledged, also
when it fails, so one failure never wedges later ones; a clear keeps the slots that surviving entries name; reload
outcomes are coalesced per page (a stalled writer queues one per page, not one per hit) and a flush returns only
once the outcomes recorded before it took effect."""

import threading
import time

import numpy as np

import l3kit
from l3kit import K, NS, key
from sglang_glm_ext.l3.disk.format import slot_bytes_for
from sglang_glm_ext.l3.disk.slab import fail_write
from sglang_glm_ext.l3.engine.messages import Barrier, ClearRank, Completion, FreePages
from sglang_glm_ext.l3.engine.store import L3Store

PB = 3 * 4096 + 100  # not a BLOCK multiple, like GLM-5's pages
SLOT = slot_bytes_for(PB)
page = l3kit.pages_of(PB)


def cfg(tmp_path, slots=16, **over):
    queues = {"staging_bytes": 32 * SLOT, "write_batch_pages": 4, "io_threads": 2, "reload_threads": 2}
    return l3kit.config(tmp_path, budget=slots * SLOT, deployment="w", map_size=64 * 2**20,
                        **l3kit.merged({"gc": {"start": 0.9, "stop": 0.5, "budget_per_round": 4}, "queues": queues},
                                       over))


def spill_durable(s, idxs, salt="k"):
    l3kit.spill_durable(s, idxs, salt, nbytes=PB)


def corrupt(s, i, salt="k"):
    """Flip a payload byte of page i on disk: its next read fails verification."""
    with open(s.slab(K).path, "r+b") as f:
        at = s.locate(K, key(i, salt))[2] * SLOT + 7
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0xFF]))


def test_the_writer_thread_alone_touches_the_pools_and_the_lrus(store):
    """Every mutation of a slot pool or a page LRU after open runs on the writer thread, whatever path triggers
    it: spills (and the pool-full reclaim on the write path), failed writes, GC, reload touches, a verify failure,
    free, clear. (No lock guards either: a second thread would be a race.)"""
    st = store.diagnostics().home(K)
    threads: dict = {}
    for obj, names in ((st.pool, ("alloc", "free", "reset", "rebuild_from_allocated", "grow_to")),
                       (st.lru, ("record", "push", "pop_coldest", "reset", "load"))):
        for name in names:
            real = getattr(obj, name)

            def spy(*a, _real=real, _name=f"{type(obj).__name__}.{name}", **kw):
                threads.setdefault(_name, set()).add(threading.current_thread().name)
                return _real(*a, **kw)

            setattr(obj, name, spy)

    spill_durable(store, range(12))  # 12 of 16 slots
    store.slab(K).inject_write_fault(fail_write())
    assert all(store.spill(K, [key(i, "bad") for i in range(2)], [page(i, "bad") for i in range(2)]))
    assert store.flush(30)
    store.slab(K).inject_write_fault(None)
    dst = [np.zeros(PB, np.uint8) for _ in range(3)]
    assert store.reload_into(K, [key(i) for i in (9, 10, 11)], dst) == [True] * 3  # touches
    corrupt(store, 11)
    assert store.reload_into(K, [key(11)], dst[:1]) == [False]  # a verify failure: reclaimed
    spill_durable(store, range(100, 108))  # over gc.start: GC and the write path reclaim
    store.free(K, [key(107)])
    assert store.flush(30) and store.exists(K, [key(107)]) == 0
    assert store.clear(30)
    spill_durable(store, range(200, 202))

    st_ = store.stats()
    assert st_["write_errors"] == 2 and st_["verify_failures"] == 1 and st_["gc_reclaimed"] > 0
    assert {"SlotPool.alloc", "SlotPool.free", "PageLRU.record", "PageLRU.pop_coldest", "PageLRU.reset",
            "SlotPool.rebuild_from_allocated"} <= set(threads), sorted(threads)  # every path above ran
    assert {name: ts for name, ts in threads.items() if ts != {"l3-writer-r0"}} == {}


def test_control_operations_are_applied_in_the_order_they_were_posted(store):
    spill_durable(store, range(6))
    w = store.diagnostics().writer
    applied, entered, release = [], threading.Event(), threading.Event()
    real_free, real_clear = w.reclaim.free, w._clear
    mine = {store.diagnostics().index_key(K, key(i)): i for i in range(6)}

    def free(kind, ikeys):
        applied.append(("free", [mine[k] for k in ikeys]))
        if len(applied) == 1:  # hold the writer inside the first operation while the others are posted
            entered.set()
            assert release.wait(30)
        return real_free(kind, ikeys)

    def clear():
        applied.append(("clear",))
        return real_clear()

    w.reclaim.free, w._clear = free, clear
    try:
        store.free(K, [key(0)])
        assert entered.wait(10)
        store.free(K, [key(1)])
        done = Completion()
        w.post(ClearRank(done))
        store.free(K, [key(2)])
        store.free(K, [key(3), key(4)])
        assert [type(op) for op in w._ctl] == [FreePages, ClearRank, FreePages, FreePages]
    finally:
        release.set()
    assert done.wait(30) and done.ok and store.flush(30)
    assert applied == [("free", [0]), ("free", [1]), ("clear",), ("free", [2]), ("free", [3, 4])]
    assert w.ctl_done == w.ctl_posted


# Issue 7, found by reading: a failing control operation still completes (no later flush/clear times out), and
# clear() says whether it cleared.
def test_a_free_that_fails_inside_the_writer_does_not_wedge_later_flushes(store, monkeypatch):
    spill_durable(store, range(3))
    real = store.index.get_many
    calls = {"n": 0}

    def failing_once(keys):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected index failure inside free")
        return real(keys)

    monkeypatch.setattr(store.index, "get_many", failing_once)
    store.free(K, [key(0)])
    assert store.flush(5)  # before: the free never signalled completion, so every later flush timed out
    assert store.stats()["data_path_errors"] >= 1
    store.free(K, [key(1)])  # and the writer still serves control operations
    assert store.flush(5)
    assert store.exists(K, [key(1)]) == 0 and store.exists(K, [key(2)]) == 1


def test_a_clear_that_cannot_delete_reports_false_and_later_operations_complete(store, monkeypatch):
    spill_durable(store, range(3))

    def broken(*a, **kw):
        raise RuntimeError("injected index failure inside clear")

    monkeypatch.setattr(store.index, "delete_for", broken)
    assert store.clear(5) is False  # before: True, although nothing was cleared
    monkeypatch.undo()
    assert store.flush(5)
    assert store.exists(K, [key(i) for i in range(3)]) == 3  # still present, still readable
    out = np.zeros(PB, np.uint8)
    assert store.reload_into(K, [key(1)], [out]) == [True] and np.array_equal(out, page(1))
    assert store.clear(5) is True and store.exists(K, [key(0)]) == 0


def test_a_clear_that_stops_partway_keeps_the_slots_of_the_surviving_entries(tmp_path, monkeypatch):
    """Found by reading: clear reset the slot pools even when the index delete stopped partway (map full), so
    slots that surviving entries point at were handed out again."""
    import lmdb

    store = L3Store.open(cfg(tmp_path, slots=64), rank=0, namespace=NS, page_bytes={K: PB})
    try:
        spill_durable(store, range(10))
        real = store.index.delete_for

        def half_then_full(dep, rank, *a, **kw):
            ours = sorted(k for k, e in store.index.iter_prefix(dep) if e.rank == rank)
            with store.index.env.begin(db=store.index.db, write=True) as txn:
                for k in ours[:5]:
                    txn.delete(k)
            raise lmdb.MapFullError("injected: map full after the first chunk")

        monkeypatch.setattr(store.index, "delete_for", half_then_full)
        assert store.clear(5) is False
        monkeypatch.setattr(store.index, "delete_for", real)
        survivors = [i for i in range(10) if store.exists(K, [key(i)])]
        assert len(survivors) == 5
        assert store.stats()["slots"]["target_kv"]["used"] == 5  # their slots stay allocated
        spill_durable(store, range(100, 120))  # new pages take free slots only
        assert all(store.reload_into(K, [key(i)], [np.zeros(PB, np.uint8)]) == [True] for i in survivors)
        dst = [np.zeros(PB, np.uint8) for _ in survivors]
        assert store.reload_into(K, [key(i) for i in survivors], dst) == [True] * 5
        assert all(np.array_equal(d, page(i)) for d, i in zip(dst, survivors))
        assert store.exists(K, [key(i) for i in range(100, 120)]) == 20
    finally:
        store.close()


def test_reload_hits_while_the_writer_is_stalled_do_not_queue_one_message_each(tmp_path):
    store = L3Store.open(cfg(tmp_path, queues={"write_batch_pages": 1}), rank=0, namespace=NS, page_bytes={K: PB})
    spill_durable(store, range(4))
    gate = l3kit.Gate()
    store.slab(K).inject_write_fault(gate)
    try:
        for i in range(10, 16):  # one write blocked in the I/O pool, two batches queued: the writer blocks
            store.spill(K, [key(i)], [page(i)])
        assert gate.entered.wait(10)
        keys = [key(i) for i in range(4)]
        dsts = [np.zeros(PB, np.uint8) for _ in keys]
        for _ in range(500):
            assert store.reload_into(K, keys, dsts) == [True] * 4
        st = store.stats()
        assert st["control_queue_depth"] + st["pending_touches"] <= 4 + 8  # before: 2,000 queued touches
    finally:
        gate.open.set()
        store.slab(K).inject_write_fault(None)
        store.close()


class _SeenWaiting:
    """The writer's condition, telling when ``thread`` first waits on it (flush() took its counts, then waits)."""

    def __init__(self, cond):
        self.cond, self.thread, self.waiting = cond, None, threading.Event()

    def __enter__(self):
        return self.cond.__enter__()

    def __exit__(self, *exc):
        return self.cond.__exit__(*exc)

    def wait(self, timeout=None):
        if threading.current_thread() is self.thread:
            self.waiting.set()
        return self.cond.wait(timeout)

    def __getattr__(self, name):
        return getattr(self.cond, name)


def test_flush_returns_only_after_the_reload_outcomes_recorded_before_it_are_applied(store):
    """Issue 20, item 5: flush() promises that everything issued before it has taken effect, reloads included: a
    page that failed verification in a reload that returned before the call is reclaimed (exists no longer counts
    it) and hits are persisted. It used to return one writer round early when its barrier was taken in the same
    writer pass that had already swapped out the reload outcomes (the bad page recorded meanwhile): the schedule is
    forced here with two control messages that hold the writer inside that pass."""
    s = store
    spill_durable(s, [5, 6])
    corrupt(s, 5)  # a verify failure at the next read
    w = s.diagnostics().writer
    real_free = w.reclaim.free
    hold = {key(101): threading.Event(), key(102): threading.Event()}
    entered = {k: threading.Event() for k in hold}

    def held_free(kind, ikeys):
        for k, ev in hold.items():
            if s.diagnostics().index_key(K, k) in ikeys:
                entered[k].set()
                assert ev.wait(30)
        return real_free(kind, ikeys)

    w.reclaim.free = held_free
    w.cond = seen = _SeenWaiting(w.cond)
    try:
        s.free(K, [key(101)])  # the writer's pass takes it (its reload outcomes already swapped) and waits
        assert entered[key(101)].wait(10)
        assert s.reload_into(K, [key(5)], [np.zeros(PB, np.uint8)]) == [False]  # recorded during that pass
        assert s.reload_into(K, [key(6)], [np.zeros(PB, np.uint8)]) == [True]  # a hit: a touch to persist
        got = []
        t = seen.thread = threading.Thread(target=lambda: got.append(s.flush(30)))
        t.start()
        assert seen.waiting.wait(30)  # flush() took its count (it waits for the first free)...
        s.free(K, [key(102)])  # ...so this one, posted after, is not part of it
        hold[key(101)].set()
        assert entered[key(102)].wait(10)
        deadline = time.monotonic() + 60  # a hang guard: flush posts its barrier as soon as the first free is done
        while not any(isinstance(op, Barrier) for op in list(w._ctl)):  # flush's barrier queued behind it
            assert time.monotonic() < deadline, "flush() never queued its barrier"
            time.sleep(0.002)
        hold[key(102)].set()  # the same pass now takes the barrier
        t.join(30)
        assert got == [True]
        assert s.exists(K, [key(5)]) == 0 and s.stats()["verify_failures"] == 1  # reclaimed before flush returned
        assert s.stats()["pending_touches"] == 0 and not w._touch_pending  # the hit reached the index too
    finally:
        w.cond = seen.cond
        for ev in hold.values():
            ev.set()
