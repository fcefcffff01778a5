"""l3/engine/kinds.py: a kind's page LRU (coldest first, touched pages warm, equal times in push order, the heap
bounded by the live pages) and its slot accounting beside retired slabs of other slot sizes (``grant``,
``held_bytes``, ``slab_of``).

PageLRU and KindState on their own, no store: the store's GC over them (its heap bounded through reload hits,
touched pages kept) is tests/l3/engine/test_reclaim.py."""

import itertools

from l3kit import K
from sglang_glm_ext.l3.engine.kinds import HEAP_SLACK, KindState, PageLRU, RetiredSlab
from sglang_glm_ext.l3.engine.slot_pool import SlotPool


def lru():
    return PageLRU(itertools.count(1))


def keys_of(popped):
    return [k for k, _, _ in popped]


def test_the_coldest_pages_come_first_and_equal_times_in_push_order():
    q = lru()
    for name, la, slot in [(b"c", 30, 2), (b"a", 10, 0), (b"b2", 20, 5), (b"b1", 20, 1), (b"d", 40, 3)]:
        q.record(name, la, slot)
    assert q.pop_coldest(2) == [(b"a", 10, 0), (b"b2", 20, 5)]  # b2 was pushed before b1 at the same time
    assert keys_of(q.pop_coldest(10)) == [b"b1", b"c", b"d"]
    # Popped is not reclaimed: the pages stay live in `current` until their reclaim deletes them.
    assert set(q.current) == {b"a", b"b1", b"b2", b"c", b"d"}


def test_a_touched_page_goes_to_the_warm_end_and_its_stale_heap_item_is_skipped():
    q = lru()
    for i in range(4):
        q.record(bytes([i]), 100 + i, i)
    q.record(bytes([0]), 200, 0)  # a reload hit on the coldest page
    assert keys_of(q.pop_coldest(4)) == [bytes([1]), bytes([2]), bytes([3]), bytes([0])]
    assert q.pop_coldest(4) == []  # the old item of page 0 was dropped, not handed out a second time


def test_a_page_freed_or_moved_since_its_push_is_never_handed_out():
    q = lru()
    q.record(b"gone", 1, 0)
    q.record(b"moved", 2, 1)
    q.record(b"kept", 3, 2)
    del q.current[b"gone"]  # reclaimed or freed since
    q.current[b"moved"] = (2, 7)  # same time, another slot: the heap item names a slot the page no longer has
    assert q.pop_coldest(10) == [(b"kept", 3, 2)]


def test_the_heap_stays_bounded_by_the_live_pages_however_many_touches_arrive():
    q = lru()
    live = 5
    for t in range(10_000):
        q.record(bytes([t % live]), t, t % live)
        assert len(q.heap) <= 2 * len(q.current) + HEAP_SLACK
    assert len(q.current) == live
    # Compactions kept the order: the page touched last is the warmest.
    assert keys_of(q.pop_coldest(live)) == [bytes([(10_000 - live + i) % live]) for i in range(live)]


def test_load_seeds_from_durable_entries_and_reset_keeps_exactly_the_given_pages():
    q = lru()
    q.load([(b"x", 50, 4), (b"y", 10, 9), (b"z", 30, 1)])
    assert keys_of(q.pop_coldest(1)) == [b"y"]  # hot pages stay hot across a load
    q.active = True
    q.reset({b"z": (30, 1)})
    assert q.current == {b"z": (30, 1)} and not q.active  # GC idle after a clear
    assert q.pop_coldest(10) == [(b"z", 30, 1)]


def _state(num_slots=10, slot_bytes=8192, retired=(), namespaces=()):
    return KindState(kind=K, page_bytes=slot_bytes - 128, slot_bytes=slot_bytes, num_slots=num_slots, slab=None,
                     pool=SlotPool(num_slots), lru=lru(), retired=list(retired), namespaces=set(namespaces))


def _retired(pages, slot_bytes=12288, namespaces=(b"old",)):
    r = RetiredSlab(path="old.slab", slab=None, slot_bytes=slot_bytes, num_slots=64, namespaces=set(namespaces),
                    lru=lru())
    for i in range(pages):
        r.lru.record(bytes([i]), i, i)
    return r


def test_retired_slabs_hold_their_live_pages_of_the_budget_and_the_grant_is_what_they_leave():
    assert _state().grant() == 10  # alone: every slot
    r = _retired(pages=2)  # 2 x 12 KiB held: 24 KiB of the kind's 80 KiB share
    assert r.held_bytes == 2 * 12288
    st = _state(retired=[r])
    assert st.grant() == (10 * 8192 - 2 * 12288) // 8192 == 7
    r.lru.record(bytes([9]), 9, 9)
    del r.lru.current[bytes([0])], r.lru.current[bytes([1])]  # GC reclaimed two, one more arrived: one left
    assert r.held_bytes == 12288 and st.grant() == 8
    assert _state(retired=[_retired(pages=20)]).grant() == 0  # never negative: the old slab holds it all


def test_an_entry_is_placed_on_the_slab_its_namespace_names():
    own, side, old = b"own", b"side", b"old"
    alone = _state(namespaces=[side])
    assert alone.slab_of(own, own) is alone and alone.slab_of(side, own) is alone
    assert alone.slab_of(b"other", own) is alone  # one slab: every entry of the kind is on it
    r = _retired(pages=1, namespaces=[old])
    st = _state(retired=[r], namespaces=[side])
    assert st.slab_of(own, own) is st and st.slab_of(side, own) is st and st.slab_of(old, own) is r
    assert st.slab_of(b"other", own) is None  # several slabs and none lists it: it cannot be placed (a miss)
