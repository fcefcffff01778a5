"""What a damaged index keeps: the records a bounded byte walk can prove, and the fresh index written from them.

``salvage_records`` walks the committed tree with ``index_walk.py`` (never a map): with ``collect=False`` it is the
check's walk, counting; with ``collect=True`` the salvage, keeping every record it can prove (``index_check.py``'s
docstring, 3., says which). ``rebuild_index`` writes them into a fresh environment and swaps it in. Standard library
and ``lmdb`` only.
"""

from __future__ import annotations

import os

from .index_walk import (DB, F_SUBDATA, P_DIRTY, P_INVALID, P_LEAF, PAGE, PageFile, TreeWalk, free_pages,
                         meta_problems, newest_meta, read_metas)

DB_NAME = b"pages"
KEY_LEN = 57  # engine/index_entry.py's KEY_LEN and VALUE_LEN (tests/l3/engine/test_index_bitrot.py checks they agree)
VALUE_LEN = 16


def salvage_records(data_path: str, collect: bool = True) -> "tuple[list[tuple[bytes, bytes]], dict]":
    """Every ``pages`` record of the committed tree that a bounded byte walk can prove (index_check.py's docstring,
    3.), sorted by key, unique. Never raises for any file content (OSError only where the file cannot be opened at
    all); ([], info) when nothing can be proven.

    ``collect=False`` is the check: the same walk, counting records instead of keeping them (``info["walked"]``),
    no orphan adoption. It adds to lmdb.verify what a search relies on and the verifier does not look at: every
    record lies inside its parent's separator bounds (a separator changed within its siblings' order sends a
    lookup to the wrong leaf: a miss, and an insert there a second copy of a key), the committed meta is provably
    the newest, and the ``pages`` records are this index's 57-byte keys and 16-byte values."""
    info: dict = {"claimed": 0, "problems": [], "walked": 0, "adopted": 0}
    f = PageFile(data_path)
    try:
        m = _committed_meta(f, collect, info)
        if m is None:
            return [], info
        if m["last_pg_claimed"] != m["last_pg"]:
            info["problems"].append("the committed meta names pages past the end of the file (truncated, or a "
                                    "damaged meta): what lies beyond is lost")
        seen = bytearray(m["last_pg"] + 1)
        free, fkeys, fprob = free_pages(f, m, seen)
        info["problems"] += fprob[:10]
        if m["txnid"] > 1 and m["txnid"] not in fkeys:
            info["problems"].append(f"the committed meta (txnid {m['txnid']}) is not proven newest")
            return [], info
        db = _pages_db(f, m, seen, free, info)
        if db is None:
            return [], info
        info["claimed"] = db[6]
        if db[7] == P_INVALID:
            return [], info
        recs, w = _walk_pages(f, m, seen, free, db, collect, info)
        if not collect:
            return [], info
        info["walked"] = len(recs)
        if w.skipped and not fprob and not w.free_hits:
            _adopt_orphans(f, m, seen, free, recs, info)
        recs.sort()
        out = [r for i, r in enumerate(recs) if i == 0 or r[0] != recs[i - 1][0]]
        return out, info
    except Exception as e:  # bounded reads leave nothing expected here; whatever it is, nothing is proven
        info["problems"].append(f"salvage stopped: {type(e).__name__}: {e}")
        return [], info
    finally:
        f.close()


def _committed_meta(f: PageFile, collect: bool, info: dict) -> "dict | None":
    """The meta page whose trees are walked: the check takes the one LMDB's open picks and judges both; a salvage
    takes the newest commit as two witnesses per page establish it. None (the reason in ``info``): nothing proven."""
    ms = read_metas(f, every=True)
    if not collect:
        valid = [x for x in ms if x["valid"]]
        if not valid:
            info["problems"].append("no valid meta page")
            return None
        info["problems"] += meta_problems(valid, f)
        return max(valid, key=lambda x: x["txnid"])  # the page LMDB's open picks
    m = newest_meta(f, ms, info)
    if m is None:
        info["problems"].append("which meta page holds the newest commit cannot be established (txnid fields "
                                "and trees disagree): nothing is proven")
    return m


def _pages_db(f: PageFile, m: dict, seen: bytearray, free: bytearray, info: dict) -> "tuple | None":
    """The ``pages`` DB record, read by walking the main DB (whose own counters are checked against the walk);
    None where the main DB is empty or the record is missing or damaged."""
    subdbs = []

    def main_rec(key, nfl, val):
        if key == DB_NAME and nfl & F_SUBDATA and len(val) == 48:
            subdbs.append(DB.unpack_from(val, 0))

    root, depth = m["main"][7], m["main"][2]
    if root == P_INVALID:
        return None
    w = TreeWalk(f, m["last_pg"], seen, free)
    w.walk(root, depth, main_rec)
    info["problems"] += w.problems[:10]
    _pad, _fl, d, b, lf, o, e, _r = m["main"]
    if (d, b, lf, o, e) != (w.depth, w.branch, w.leaf, 0, w.records):
        info["problems"].append(f"main DB record says depth/branch/leaf/overflow/entries {d}/{b}/{lf}/{o}/{e}, "
                                f"the walk found {w.depth}/{w.branch}/{w.leaf}/0/{w.records}")
    if len(subdbs) != 1:
        info["problems"].append("the pages DB record is missing or damaged")
        return None
    return subdbs[0]


def _walk_pages(f: PageFile, m: dict, seen: bytearray, free: bytearray, db: tuple, collect: bool,
                info: dict) -> "tuple[list, TreeWalk]":
    """The ``pages`` tree's walk: its records (``collect``) or their count in ``info["walked"]``, with the DB
    record's counters checked against what the walk found."""
    recs: list[tuple[bytes, bytes]] = []
    w = TreeWalk(f, m["last_pg"], seen, free)
    if collect:
        w.walk(db[7], db[2], lambda k, nfl, v: recs.append((k, v)), leaf_schema=(KEY_LEN, VALUE_LEN))
    else:
        w.walk(db[7], db[2], None, leaf_schema=(KEY_LEN, VALUE_LEN))
        info["walked"] = w.records
        # The DB record's counters against what the walk found (LMDB sizes cursor stacks and page budgets by
        # them): a damaged count is damage even where every page is sound.
        _pad, _fl, depth, branch, leaf, overflow, entries, _root = db
        if (depth, branch, leaf, overflow, entries) != (w.depth, w.branch, w.leaf, 0, w.records):
            info["problems"].append(f"pages DB record says depth/branch/leaf/overflow/entries "
                                    f"{depth}/{branch}/{leaf}/{overflow}/{entries}, the walk found "
                                    f"{w.depth}/{w.branch}/{w.leaf}/0/{w.records}")
    info["problems"] += w.problems[:40]
    info["skipped"] = w.skipped
    info["adopted"] = 0
    return recs, w


def _adopt_orphans(f: PageFile, m: dict, seen: bytearray, free: bytearray, recs: list, info: dict) -> None:
    """Orphans: with a clean freeDB (and the metas proven), every page up to last_pg is either reachable or free; a
    leaf that is neither was reachable in the committed tree until a pointer to it was damaged. Its records are
    committed entries: adopt them into ``recs`` (a free page -- deleted entries -- never is). The caller calls this
    only when the free set is not in doubt: a damaged free-list entry would make a freed leaf look like an orphan (a
    changed page number lands on a live page -- reachable and free -- or a free one -- listed twice --, both refused
    there, unless it lands in the lost subtree: two related flips)."""
    have = {k for k, _ in recs}
    for p in range(2, m["last_pg"] + 1):
        if seen[p] or free[p]:
            continue
        buf = f.page(p)
        if buf is None:
            continue
        stored, _pad, flags, _lo, _up = PAGE.unpack_from(buf, 0)
        if stored != p or flags & ~P_DIRTY != P_LEAF:
            continue
        got: list = []
        ow = TreeWalk(f, m["last_pg"], seen, free)
        ow.walk(p, 1, lambda k, nfl, v: got.append((k, v)), leaf_schema=(KEY_LEN, VALUE_LEN))
        new = [(k, v) for k, v in got if k not in have]
        recs += new
        have.update(k for k, _ in new)
        info["adopted"] += len(new)


def rebuild_index(path: str, records: "list[tuple[bytes, bytes]]", map_size: int, moved_to: str) -> None:
    """Write ``records`` (sorted, unique) into a fresh environment beside ``<path>/data.mdb``, then move the damaged
    file to ``moved_to`` and the fresh one into its place; durable on return. The caller holds the gate and LMDB's
    exclusive lock (nobody has the file mapped). A failure before the renames (ENOSPC, a full map) leaves the damaged
    file where it was and raises: nothing is half-replaced.

    The fresh environment is opened as the server opens its index (a directory, no other flags): LMDB keeps the
    opener's flags in the meta pages, which the check requires to be exactly the server's."""
    import shutil

    import lmdb
    data = os.path.join(path, "data.mdb")
    tmp = os.path.join(path, f"salvage-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        os.mkdir(tmp, 0o700)
        env = lmdb.open(tmp, subdir=True, map_size=max(map_size, 1 << 20), max_dbs=4, lock=True, sync=True,
                        metasync=True, mode=0o600, readahead=False, meminit=False)
        try:
            db = env.open_db(DB_NAME, create=True)
            with env.begin(db=db, write=True) as txn:
                txn.cursor().putmulti(records, append=True)
            env.sync(True)
        finally:
            env.close()
        os.rename(data, moved_to)
        os.replace(os.path.join(tmp, "data.mdb"), data)
    finally:
        # Its lock.mdb goes with it; the index's own lock.mdb stays (an opener may wait on its lock): LMDB's next
        # exclusive opener re-initialises it.
        shutil.rmtree(tmp, ignore_errors=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
