"""engine/index_walk.py, the bounded LMDB page walker, on its own (test_index_check.py and test_index_bitrot.py judge
whole files through it): the fast leaf path and the node-by-node path find the same records of a sound tree, a page
reached twice is skipped and noted, and a leaf key out of order costs only itself."""

from __future__ import annotations

import lmdb
import pytest

from sglang_glm_ext.l3.engine import index_walk as iw
from sglang_glm_ext.l3.engine.index_salvage import DB_NAME, KEY_LEN, VALUE_LEN


@pytest.fixture
def index_file(tmp_path):
    """A fresh ``pages`` DB of 3000 57-byte keys / 16-byte values (several leaves and a branch level)."""
    env = lmdb.open(str(tmp_path), subdir=True, map_size=64 << 20, max_dbs=4)
    db = env.open_db(DB_NAME, create=True)
    records = [(i.to_bytes(4, "big") + b"k" * (KEY_LEN - 4), i.to_bytes(4, "little") * (VALUE_LEN // 4))
               for i in range(3000)]
    with env.begin(db=db, write=True) as txn:
        txn.cursor().putmulti(records)
    env.close()
    f = iw.PageFile(str(tmp_path / "data.mdb"))
    yield f, records
    f.close()


def _pages_db(f: iw.PageFile) -> "tuple[dict, tuple]":
    m = max(iw.read_metas(f), key=lambda x: x["txnid"])
    found = []
    iw.TreeWalk(f, m["last_pg"], bytearray(m["last_pg"] + 1)).walk(
        m["main"][7], 32, lambda k, nfl, v: found.append(iw.DB.unpack_from(v, 0)) if k == DB_NAME else None)
    return m, found[0]


def test_the_fast_and_the_node_by_node_path_find_the_same_records(index_file):
    f, records = index_file
    m, db = _pages_db(f)
    walks = {}
    # keyfn given: the node-by-node path for every leaf (the fast path needs memcmp order)
    for name, keyfn in (("fast", None), ("nodes", lambda k: k)):
        got = []
        w = iw.TreeWalk(f, m["last_pg"], bytearray(m["last_pg"] + 1))
        w.walk(db[7], db[2], lambda k, nfl, v: got.append((bytes(k), bytes(v))), leaf_schema=(KEY_LEN, VALUE_LEN),
               keyfn=keyfn)
        walks[name] = (got, w.records, w.leaf, w.branch, w.depth, w.skipped, w.problems)
    assert walks["fast"] == walks["nodes"]
    got, n, leaves, branches, depth, skipped, problems = walks["fast"]
    assert got == records and n == 3000 and (skipped, problems) == (0, [])
    # the DB record's own counters are what the walk found
    assert (db[2], db[3], db[4], db[6]) == (depth, branches, leaves, n) and branches >= 1 and depth >= 2


def test_a_page_reached_twice_is_skipped_and_noted(index_file):
    f, _ = index_file
    m, db = _pages_db(f)
    seen = bytearray(m["last_pg"] + 1)
    first = iw.TreeWalk(f, m["last_pg"], seen)
    first.walk(db[7], db[2], None, leaf_schema=(KEY_LEN, VALUE_LEN))
    again = iw.TreeWalk(f, m["last_pg"], seen)
    again.walk(db[7], db[2], None, leaf_schema=(KEY_LEN, VALUE_LEN))
    assert first.records == 3000 and again.records == 0
    assert again.skipped == 1 and again.problems == [f"page {db[7]} reached twice"]


def test_a_leaf_key_out_of_order_costs_only_itself(index_file):
    f, records = index_file
    m, db = _pages_db(f)
    w = iw.TreeWalk(f, m["last_pg"], bytearray(m["last_pg"] + 1))
    w.walk(db[7], db[2], None)
    leaf = next(p for p in range(2, m["last_pg"] + 1) if w.seen[p] and f.page(p)[10] == iw.P_LEAF)
    buf = bytearray(f.page(leaf))
    lower = int.from_bytes(buf[12:14], "little")
    offs = [int.from_bytes(buf[iw.PHDR + 2 * i:iw.PHDR + 2 * i + 2], "little") for i in range((lower - iw.PHDR) >> 1)]
    buf[offs[1] + 8:offs[1] + 12] = b"\xff\xff\xff\xff"  # the second key now sorts after every other key of the leaf
    data = bytes(buf)
    f.page = lambda p, _page=f.page: data if p == leaf else _page(p)  # the damaged copy, the file left as it was
    got = []
    w = iw.TreeWalk(f, m["last_pg"], bytearray(m["last_pg"] + 1))
    w.walk(leaf, 1, lambda k, nfl, v: got.append(bytes(k)), leaf_schema=(KEY_LEN, VALUE_LEN))
    assert len(got) == len(offs) - 1 and bytes(data[offs[1] + 8:offs[1] + 8 + KEY_LEN]) not in got
    assert w.problems == [f"page {leaf}: 1 key(s) out of order"]
    assert set(got) <= {k for k, _ in records}


def test_longest_increasing_drops_the_key_that_breaks_the_order_not_its_neighbours():
    recs = [(1, "a"), (9, "damaged"), (2, "b"), (3, "c"), (4, "d")]
    assert iw.longest_increasing(recs) == [(1, "a"), (2, "b"), (3, "c"), (4, "d")]
    assert iw.longest_increasing(recs[2:]) == recs[2:] and iw.longest_increasing([]) == []
