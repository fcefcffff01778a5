import random
import sys
import tracemalloc

import pytest

from sglang_glm_ext.l3.engine import slot_pool as slot_pool_mod
from sglang_glm_ext.l3.engine.slot_pool import SlotPool, SlotPoolError


def test_alloc_until_full_then_none():
    pool = SlotPool(4)
    got = [pool.alloc() for _ in range(4)]
    assert sorted(got) == [0, 1, 2, 3] and got[0] == 0  # fresh slab fills from the front
    assert pool.alloc() is None
    assert (pool.used, pool.free_count, pool.total) == (4, 0, 4)


def test_free_makes_slot_reusable_and_counts_track():
    pool = SlotPool(3)
    a, b = pool.alloc(), pool.alloc()
    pool.free(a)
    assert not pool.is_allocated(a) and pool.is_allocated(b)
    assert pool.used == 1
    assert pool.alloc() == a  # LIFO: the freed slot comes back first


def test_double_free_and_out_of_range_are_loud():
    pool = SlotPool(2)
    s = pool.alloc()
    pool.free(s)
    with pytest.raises(SlotPoolError, match="double free"):
        pool.free(s)
    with pytest.raises(SlotPoolError, match="double free"):
        pool.free(1)  # never allocated
    for bad in (-1, 2, 10**9, True, 1.0):
        with pytest.raises(SlotPoolError, match="out of range"):
            pool.free(bad)
    with pytest.raises(SlotPoolError):
        SlotPool(0)


def test_reset_frees_everything():
    pool = SlotPool(5)
    for _ in range(5):
        pool.alloc()
    pool.reset()
    assert pool.used == 0 and pool.free_count == 5
    assert sorted(pool.alloc() for _ in range(5)) == list(range(5))


def test_rebuild_from_allocated_never_hands_out_live_slots():
    pool = SlotPool(1000)
    live = set(random.Random(3).sample(range(1000), 300))
    pool.rebuild_from_allocated(iter(live))
    assert pool.used == 300
    handed = {pool.alloc() for _ in range(700)}
    assert handed.isdisjoint(live) and len(handed) == 700
    assert pool.alloc() is None
    assert all(pool.is_allocated(s) for s in live)


def test_rebuild_rejects_duplicates_and_out_of_range_without_corrupting():
    pool = SlotPool(10)
    pool.rebuild_from_allocated([1, 2])
    with pytest.raises(SlotPoolError, match="more than once"):
        pool.rebuild_from_allocated([3, 4, 3])
    with pytest.raises(SlotPoolError, match="out of range"):
        pool.rebuild_from_allocated([9, 10])
    with pytest.raises(SlotPoolError, match="out of range"):
        pool.rebuild_from_allocated([-1])
    assert pool.used == 2 and pool.is_allocated(1) and pool.is_allocated(2)  # failed rebuilds left state alone
    pool.rebuild_from_allocated([])
    assert pool.used == 0


def test_random_alloc_free_keeps_invariant():
    rng = random.Random(11)
    pool = SlotPool(64)
    held = set()
    for _ in range(5000):
        if held and rng.random() < 0.5:
            s = rng.choice(sorted(held))
            pool.free(s)
            held.remove(s)
        else:
            s = pool.alloc()
            if s is None:
                assert len(held) == 64
            else:
                assert s not in held
                held.add(s)
        assert pool.used == len(held)


def _slot_pool_lines(fn) -> int:
    """Lines of slot_pool.py that Python ran for ``fn()`` (numpy's C loops run none): a per-slot loop shows as one
    or more a slot."""
    n, here, old = [0], slot_pool_mod.__file__, sys.gettrace()

    def local(frame, event, arg):
        n[0] += event == "line"
        return local

    sys.settrace(lambda frame, event, arg: local if frame.f_code.co_filename == here else None)
    try:
        fn()
    finally:
        sys.settrace(old)
    return n[0]


def test_millions_of_slots_stay_small_and_vectorised():
    tracemalloc.start()
    pool = SlotPool(4_000_000)
    pool.rebuild_from_allocated(range(0, 4_000_000, 2))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert pool.used == 2_000_000
    assert pool.alloc() % 2 == 1
    # 1 B/slot map + 8 B/free slot stack, plus transient numpy arrays during rebuild; Python int sets would be >200 MB
    assert peak < 150 * 2**20, peak
    # Fast at millions of slots means no Python work a slot: building and rebuilding 4M slots runs the same Python
    # lines as 4K (an operation count, not a stopwatch: the speed target is a benchmark's, not a test's).
    small, big = (_slot_pool_lines(lambda: SlotPool(n).rebuild_from_allocated(range(0, n, 2)))
                  for n in (4_000, 4_000_000))
    assert big == small < 200, (small, big)
