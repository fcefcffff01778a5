"""Which page reads of a reload call go to the disk together (engine/coalesce.py): pure inputs -> units.

Every position comes back exactly once; a unit is adjacent slots of one (rank, disk) in slot order, at most
read_coalesce_bytes, at least two units a reader, the largest first; staged pages stand alone and come last."""

import random

from sglang_glm_ext.l3.engine.coalesce import Place, coalesce
from sglang_glm_ext.l3.engine.index import IndexEntry

SLOT = 4096


def units(slots, coalesce_pages=8, threads=1, staged=()):
    """coalesce over pages at (rank, disk, slot) ``slots`` of 4 KiB slots, positions in ``staged`` staged; checks
    every position comes back exactly once."""
    places = [None if j in staged else Place(*s) for j, s in enumerate(slots)]
    got = coalesce(places, slot_bytes=SLOT, coalesce_bytes=coalesce_pages * SLOT, readers=threads)
    assert sorted(j for u in got for j in u) == list(range(len(slots)))
    return got


def test_units_group_adjacent_slots_of_one_slab_only():
    """The call's reads: adjacent slots of one (rank, disk) in slot order, at most read_coalesce_bytes a unit and at
    least two units a reader; staged pages and pages on other disks or beyond a gap stand alone."""
    # 7 pages, 1 reader: runs of at most 3 (two units a reader at least)
    assert sorted(units([(0, 0, s) for s in (9, 3, 4, 5, 10, 12, 8)])) == [[1, 2, 3], [5], [6, 0, 4]]
    # another disk, another rank: not adjacent, whatever the slot numbers
    assert sorted(units([(0, 0, 1), (0, 1, 2), (1, 0, 3), (0, 0, 2)])) == [[0, 3], [1], [2]]
    # a staged page stands alone (and is taken last), and its slot-less gap ends the run before it
    got = units([(0, 0, s) for s in range(8)], staged={2})
    assert got[-1] == [2] and sorted(got) == [[0, 1], [2], [3, 4, 5], [6, 7]]
    assert max(len(u) for u in units([(0, 0, s) for s in range(64)], coalesce_pages=8)) == 8
    assert len(units([(0, 0, s) for s in range(8)], threads=4)) == 8  # runs would leave a reader fewer than 2
    assert all(len(u) == 1 for u in units([(0, 0, s) for s in range(64)], coalesce_pages=1))


def test_units_give_every_reader_an_equal_share():
    """A call returns when its last unit is read, so units are cut so the readers' shares are equal: 128 adjacent
    pages at a 7-page cap and 8 readers are 24 units of 5-6 pages (runs of 7 were 19 units: 21 pages for two readers,
    14 for the rest), the largest first so the short ones are left for the end."""
    got = units([(0, 0, s) for s in range(128)], coalesce_pages=7, threads=8)
    sizes = [len(u) for u in got]
    assert len(got) == 24 and set(sizes) == {5, 6} and sizes == sorted(sizes, reverse=True)
    assert all(u == list(range(u[0], u[0] + len(u))) for u in got)  # each unit still adjacent slots, in slot order
    # taken greedily in that order (each reader the next unit when it is free), 8 readers read 16 pages each
    load = [0] * 8
    for s in sizes:
        load[load.index(min(load))] += s
    assert load == [16] * 8
    # gaps between runs: every piece still within the cap and within one run
    got = units([(0, 0, s) for s in range(100)] + [(0, 0, s) for s in range(200, 228)], coalesce_pages=7, threads=8)
    assert max(map(len, got)) <= 7 and all(u[-1] - u[0] == len(u) - 1 for u in got)
    assert max(map(len, got)) - min(map(len, got)) <= 2


def test_nothing_one_page_and_only_staged_pages():
    assert units([]) == []
    assert units([(0, 0, 7)]) == [[0]]
    assert units([(0, 0, 1), (0, 0, 2), (0, 0, 3)], staged={0, 1, 2}) == [[0], [1], [2]]  # call order
    assert units([(0, 0, 5)], staged={0}) == [[0]]


def test_too_few_pages_or_a_cap_under_two_slots_read_every_page_alone_in_slot_order():
    assert units([(0, 0, s) for s in (3, 1, 2)]) == [[1], [2], [0]]  # 3 pages < two units of two pages
    assert units([(0, 0, s) for s in (5, 4, 6, 7)]) == [[1, 0], [2, 3]]  # 4 pages: two units of two
    descending = [(0, 0, s) for s in range(9, 1, -1)]
    for cap in (0, 1):
        assert units(descending, coalesce_pages=cap) == [[j] for j in range(7, -1, -1)]
    # a cap below one slot's bytes is a cap of none
    got = coalesce([Place(0, 0, s) for s in range(8)], slot_bytes=SLOT, coalesce_bytes=SLOT - 1, readers=1)
    assert got == [[j] for j in range(8)]


def test_unsorted_input_comes_back_as_runs_in_slot_order():
    order = [6, 2, 7, 0, 5, 3, 1, 4]
    got = units([(0, 0, s) for s in order], coalesce_pages=4)
    slots = [[order[j] for j in u] for u in got]
    assert slots == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_two_pages_naming_one_slot_never_share_a_unit():
    """The same key twice in a call (two destinations): one transfer cannot land one slot twice."""
    got = units([(0, 0, s) for s in (0, 1, 1, 2, 3, 4, 5, 6)], coalesce_pages=8)
    for u in got:
        slots = [(0, 1, 1, 2, 3, 4, 5, 6)[j] for j in u]
        assert slots == list(range(slots[0], slots[0] + len(slots)))  # strictly adjacent, so no slot twice
    assert sorted(map(len, got), reverse=True) == [len(u) for u in got]


def test_an_index_entry_is_a_place():
    entries = [IndexEntry(0, 0, s, 1234) for s in range(8)]
    assert coalesce(entries, slot_bytes=SLOT, coalesce_bytes=8 * SLOT, readers=1) == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_random_inputs_keep_every_rule():
    rng = random.Random(7)
    for _ in range(300):
        n = rng.randrange(0, 60)
        slots = [(rng.randrange(2), rng.randrange(2), rng.randrange(40)) for _ in range(n)]
        staged = {j for j in range(n) if rng.random() < 0.1}
        cap, threads = rng.randrange(0, 12), rng.randrange(1, 9)
        got = units(slots, coalesce_pages=cap, threads=threads, staged=staged)
        slab = [u for u in got if u[0] not in staged]
        assert got[len(slab):] == [[j] for j in sorted(staged)]  # staged last, alone, in call order
        for u in slab:
            assert len(u) <= max(cap, 1)
            r, d, first = slots[u[0]]
            assert [slots[j] for j in u] == [(r, d, first + q) for q in range(len(u))]
        assert [len(u) for u in slab] == sorted((len(u) for u in slab), reverse=True)
