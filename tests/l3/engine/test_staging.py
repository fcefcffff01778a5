"""A page is visible to exists / reload as soon as spill accepted it (what SGLang expects of a HiCache backend): served
from its staging buffer until it is durable, never after it was cancelled or its write failed, and the writer never
releases a buffer a reader is still copying."""

import errno
import threading

import numpy as np
import pytest

import l3kit
from l3kit import K, Gate
from sglang_glm_ext.l3.disk.format import slot_bytes_for
from sglang_glm_ext.l3.disk.host_layout import PageLayout
from sglang_glm_ext.l3.engine.staging import StagedPages

PB = 2 * 4096 + 300
SLOT = slot_bytes_for(PB)
NS = l3kit.namespace(layer_end=4)


def key(i, salt="s"):
    return l3kit.key(i, salt)


def page(i, salt="s"):
    return l3kit.page(i, salt, nbytes=PB)


def cfg(tmp_path):
    return l3kit.config(tmp_path, budget=32 * SLOT, deployment="st", map_size=16 * 2**20,
                        queues={"staging_bytes": 16 * SLOT, "write_batch_pages": 4, "io_threads": 2,
                                "reload_threads": 2})


@pytest.fixture
def stalled(store):
    gate = Gate()
    store.slab(K).inject_write_fault(gate)
    yield gate
    gate.open.set()
    store.slab(K).inject_write_fault(None)


def test_a_staged_page_is_visible_and_served_before_it_is_durable(store, stalled):
    keys = [key(i) for i in range(3)]
    assert store.spill(K, keys, [page(i) for i in range(3)]) == [True] * 3
    assert store.exists(K, keys + [key(9)]) == 3  # at once, while the disk is stalled
    assert store.exists(K, keys, include_staged=False) == 0  # ...and none of it is durable yet
    dsts = [np.zeros(PB, np.uint8) for _ in range(3)]
    assert store.reload_into(K, keys, dsts) == [True] * 3
    assert all(np.array_equal(d, page(i)) for i, d in enumerate(dsts))
    host = np.zeros(4 * PB, np.uint8)  # a page-first host pool of 4 pages; page 2 gets key 1
    layout = PageLayout.page_first(host, page_bytes=PB, num_pages=4)
    assert store.reload_into_layout(K, [key(1)], layout, [2]) == [True]
    assert np.array_equal(host[2 * PB:3 * PB], page(1)) and not host[:2 * PB].any() and not host[3 * PB:].any()
    st = store.stats()
    assert st["reload_hits"] == 4 and st["reload_from_staging"] == 4 and st["verify_failures"] == 0
    stalled.open.set()
    assert store.flush(30)
    assert store.exists(K, keys, include_staged=False) == 3
    assert store.reload_into(K, keys[:1], dsts[:1]) == [True] and store.stats()["reload_from_staging"] == 4


def test_exists_is_a_prefix_over_staged_and_durable_pages(store, stalled):
    stalled.open.set()
    assert all(store.spill(K, [key(0)], [page(0)])) and store.flush(30)  # durable
    stalled.open.clear()
    assert all(store.spill(K, [key(1)], [page(1)]))  # staged behind a stalled disk
    assert store.exists(K, [key(0), key(1), key(2)]) == 2
    assert store.exists(K, [key(1), key(0)]) == 2 and store.exists(K, [key(2), key(0)]) == 0
    assert store.exists(K, [key(0), key(1)], include_staged=False) == 1


def test_a_freed_or_cleared_staged_page_is_not_visible(store, stalled):
    assert all(store.spill(K, [key(0), key(1)], [page(0), page(1)]))
    store.free(K, [key(0)])
    assert store.exists(K, [key(0)]) == 0 and store.exists(K, [key(1)]) == 1
    assert store.reload_into(K, [key(0)], [np.zeros(PB, np.uint8)]) == [False]
    stalled.open.set()
    assert store.clear(30)
    assert store.exists(K, [key(1)]) == 0
    assert store.reload_into(K, [key(1)], [np.zeros(PB, np.uint8)]) == [False]


def test_a_staged_page_whose_write_fails_disappears(store):
    gate = Gate(err=errno.EIO)
    store.slab(K).inject_write_fault(gate)
    try:
        assert store.spill(K, [key(5)], [page(5)]) == [True]
        assert store.exists(K, [key(5)]) == 1  # visible while staged
        out = np.zeros(PB, np.uint8)
        assert store.reload_into(K, [key(5)], [out]) == [True] and np.array_equal(out, page(5))
        gate.open.set()
        assert store.flush(30)
        assert store.stats()["write_errors"] == 1
        assert store.exists(K, [key(5)]) == 0  # the failed write took it out of staging: a miss from now on
        assert store.reload_into(K, [key(5)], [np.zeros(PB, np.uint8)]) == [False]
        assert store.stats()["staging_bytes"] == 0
    finally:
        gate.open.set()
        store.slab(K).inject_write_fault(None)


class HoldingLayout:
    """A PageLayout whose scatter (the reader's copy out of staging) waits until told to go on."""

    def __init__(self, layout):
        self.layout, self.num_pages, self.page_bytes = layout, layout.num_pages, layout.page_bytes
        self.copying, self.go = threading.Event(), threading.Event()

    def scatter_from(self, page_index, src, src_offset=0):
        self.copying.set()
        assert self.go.wait(30)
        return self.layout.scatter_from(page_index, src, src_offset)


def test_the_writer_never_releases_a_buffer_a_reader_is_copying(store, stalled):
    assert all(store.spill(K, [key(1)], [page(1)]))
    host = np.zeros(2 * PB, np.uint8)
    holding = HoldingLayout(PageLayout.page_first(host, page_bytes=PB, num_pages=2))
    got = []
    reader = threading.Thread(target=lambda: got.append(store.reload_into_layout(K, [key(1)], holding, [0])))
    reader.start()
    try:
        assert holding.copying.wait(10)  # the reader holds its reference on the staged page
        stalled.open.set()
        assert store.flush(30)  # the writer finished the page (durable) while the reader still copies
        assert store.stats()["staging_bytes"] == SLOT  # its buffer is kept for the reader, not back in the pool
        # A new spill cannot be handed that buffer: it gets its own, and its bytes never reach the reader.
        assert all(store.spill(K, [key(2)], [page(2)])) and store.flush(30)
    finally:
        holding.go.set()
        reader.join(30)
    assert got == [[True]] and np.array_equal(host[:PB], page(1))
    assert store.stats()["staging_bytes"] == 0  # the last reader released it
    assert store.stats()["reload_from_staging"] == 1


@pytest.mark.parametrize("delta", [-4096, -1, 1, 4096], ids=["page_cut_4k", "page_cut_1b", "pad_1b", "pad_4k"])
def test_a_layout_of_another_page_size_is_refused_for_staged_and_durable_pages_alike(store, stalled, delta):
    """Issue 20, item 3: a staged page used to be copied into a layout whose page size is not the kind's (a cut-off
    page, or the page plus pad and header bytes) and reported True; the same reload of a durable page was refused.
    Every path now checks the destination against the kind before any byte moves, and so does spill_from_layout
    (a smaller layout left stale staging bytes in the sealed payload: a wrong page made durable)."""
    other = PB + delta
    sentinel = 0xAB

    def host():
        return np.full(4 * other, sentinel, np.uint8)

    assert store.spill(K, [key(0)], [page(0)]) == [True]  # staged: the disk is stalled
    for durable in (False, True):
        if durable:
            stalled.open.set()
            assert store.flush(30) and store.exists(K, [key(0)], include_staged=False) == 1
        before = store.stats()["reload_bad_dst"]
        h = host()
        layout = PageLayout.page_first(h, page_bytes=other, num_pages=4)
        assert store.reload_into_layout(K, [key(0)], layout, [1]) == [False], ("durable" if durable else "staged")
        assert (h == sentinel).all()  # not one byte copied
        assert store.stats()["reload_bad_dst"] == before + 1
    # The same page, right-sized, is served (the refusal was the layout's, not the page's).
    ok = np.zeros(4 * PB, np.uint8)
    assert store.reload_into_layout(K, [key(0)], PageLayout.page_first(ok, page_bytes=PB, num_pages=4), [2]) == [True]
    assert np.array_equal(ok[2 * PB:3 * PB], page(0))
    # Writing from a layout of another page size is bad input: nothing is staged, nothing becomes durable.
    src = np.full(4 * other, 7, np.uint8)
    dropped = store.stats()["dropped_bad_input"]
    assert store.spill_from_layout(K, [key(1)], PageLayout.page_first(src, page_bytes=other, num_pages=4), [0]) \
        == [False]
    assert store.stats()["dropped_bad_input"] == dropped + 1
    assert store.flush(30) and store.exists(K, [key(1)]) == 0


def _wait_for(pred, timeout=60.0):
    import time

    deadline = time.monotonic() + timeout  # a hang guard: the state comes in milliseconds
    while not pred():
        assert time.monotonic() < deadline, f"the writer never got there in {timeout} s"
        time.sleep(0.005)


@pytest.mark.parametrize("where", ["in_flight", "queued", "durable_free_pending"])
def test_a_page_spilled_again_after_free_is_written(store, stalled, where):
    """Issue 20, item 4: free() of a staged page whose write is in flight, then spill() of the same key, answered
    True as a dedup (admission saw the cancelled copy) and the page was never written. The same class: a page still
    queued, and a durable page whose free the writer has not applied yet (the spill saw the old entry as a dedup,
    then the free deleted it). Each time the second spill is an acknowledgement, so the page must end up durable."""
    k, p = key(0), page(0)
    if where == "durable_free_pending":
        stalled.open.set()
        assert store.spill(K, [k], [p]) == [True] and store.flush(30)
        stalled.open.clear()
        stalled.entered.clear()
        assert store.spill(K, [key(9)], [page(9)]) == [True]  # its write stalls: the writer's free waits behind it
        assert stalled.entered.wait(10)
        store.free(K, [k])
        _wait_for(lambda: store.stats()["control_queue_depth"] == 0)  # the writer took the free and is waiting
        assert store.exists(K, [k]) == 0  # freed: not counted any more, although the delete is still to come
    else:
        if where == "queued":
            assert store.spill(K, [key(9)], [page(9)]) == [True]  # holds the disk: key 0 stays queued behind it
            assert stalled.entered.wait(10)
        assert store.spill(K, [k], [p]) == [True]
        if where == "in_flight":
            assert stalled.entered.wait(10)  # its pwrite is under way
        store.free(K, [k])
        assert store.exists(K, [k]) == 0
    assert store.spill(K, [k], [p]) == [True]  # acknowledged again...
    assert store.exists(K, [k]) == 1
    stalled.open.set()
    assert store.flush(30)
    assert store.exists(K, [k], include_staged=False) == 1  # ...so it is durable
    out = np.zeros(PB, np.uint8)
    assert store.reload_into(K, [k], [out]) == [True] and np.array_equal(out, p)
    assert store.stats()["reload_from_staging"] == 0  # from the slab


def test_write_behind_acknowledgements_are_counted_with_their_bytes_and_age_until_durable(store, stalled):
    """Issue 20, item 7: what a crash right now would lose is visible: pages acknowledged by spill and not yet
    durable, their bytes and the oldest one's age; bounded by the staging cap; back to 0 once durable."""
    import time

    assert store.spill(K, [key(i) for i in range(3)], [page(i) for i in range(3)]) == [True] * 3
    time.sleep(0.05)
    st = store.stats()
    assert (st["acked_not_durable_pages"], st["acked_not_durable_bytes"]) == (3, 3 * PB)
    assert st["acked_not_durable_oldest_s"] >= 0.05
    store.free(K, [key(0)])  # a freed page is no longer expected to be durable
    assert store.stats()["acked_not_durable_pages"] == 2
    stalled.open.set()
    assert store.flush(30)
    st = store.stats()
    assert (st["acked_not_durable_pages"], st["acked_not_durable_bytes"], st["acked_not_durable_oldest_s"]) == (0, 0, 0)


def test_a_durable_spill_answers_true_only_for_pages_durable_when_it_returns(store, stalled, monkeypatch):
    waiting = threading.Event()  # the spill staged its pages and waits for them to be finished
    real_wait = StagedPages.wait_finished

    def wait_finished(self, pages, deadline):
        waiting.set()
        return real_wait(self, pages, deadline)

    monkeypatch.setattr(StagedPages, "wait_finished", wait_finished)
    got = []
    t = threading.Thread(target=lambda: got.append(
        store.spill(K, [key(i) for i in range(3)], [page(i) for i in range(3)], wait=60.0, durable=True)))
    t.start()
    assert stalled.entered.wait(10) and waiting.wait(10)
    # The disk holds the write until the gate opens below: the spill is in its wait and cannot have answered yet.
    assert not got and store.stats()["acked_not_durable_pages"] == 0  # nothing acknowledged while not durable
    stalled.open.set()
    t.join(30)
    assert got == [[True] * 3]
    assert store.exists(K, [key(i) for i in range(3)], include_staged=False) == 3  # durable at the answer
    # A dedup answers like its copy; a page already durable is True at once.
    assert store.spill(K, [key(0)], [page(0)], wait=1.0, durable=True) == [True]


def test_a_durable_spill_that_times_out_answers_false(store, stalled):
    assert store.spill(K, [key(5)], [page(5)], wait=0.2, durable=True) == [False]
    # Bounded by its wait, not by the disk: it returned while the stalled write could not have finished (the gate
    # opens below; a spill that waited for the write would sit 30 s in the gate, then answer True).
    assert store.exists(K, [key(5)], include_staged=False) == 0
    stalled.open.set()
    assert store.flush(30) and store.exists(K, [key(5)], include_staged=False) == 1  # it may still land later


def test_a_full_staging_waits_for_room_when_the_caller_may_wait_and_drops_otherwise(tmp_path):
    """Issue 20, item 8, at the engine: with a wait a burst larger than staging is taken whole (brief
    backpressure), without one the overflow is dropped and counted."""
    from sglang_glm_ext.l3.engine.store import L3Store

    c = l3kit.config(tmp_path, budget=64 * SLOT, deployment="bp", map_size=16 * 2**20,
                     queues={"staging_bytes": 3 * SLOT, "write_batch_pages": 2, "io_threads": 1, "reload_threads": 1})
    s = L3Store.open(c, rank=0, namespace=NS, page_bytes={K: PB})
    try:
        keys = [key(i, "bp") for i in range(24)]
        pages = [page(i, "bp") for i in range(24)]
        dropped = s.spill(K, keys[:12], pages[:12])
        assert not all(dropped) and s.stats()["dropped_staging"] == dropped.count(False)
        assert s.flush(30)
        assert s.spill(K, keys[12:], pages[12:], wait=30.0) == [True] * 12
        assert s.flush(30) and s.exists(K, keys[12:], include_staged=False) == 12
        assert s.stats()["staging_peak_bytes"] <= 3 * SLOT
    finally:
        s.close()
