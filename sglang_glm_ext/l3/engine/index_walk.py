"""The bounded LMDB page walker: reads an index file's meta pages and B-trees with pread, never a map.

Every page number, offset and length read from the file is checked against the page and the file before it is
followed, the visited-page bitmap is sized by the file (never by a field), and a page reached twice, out of range or
listed as free is skipped with its subtree: no bytes in the file can make this code fault, allocate without bound or
loop. ``index_salvage.py`` proves and keeps records with it, ``index_check.py`` (whose docstring says what is
proven) checks a file with it. Standard library only.

The layout is LMDB 0.9's on a 64-bit little-endian host (as ``lmdb.verify`` reads it); a file of another layout
fails the meta check.
"""

from __future__ import annotations

import bisect
import os
import struct

# LMDB 0.9, 64-bit, native (little-endian) layout: page header 16 bytes, node header 8 bytes.
PHDR = 16
P_BRANCH, P_LEAF, P_OVERFLOW, P_META, P_DIRTY, P_LEAF2 = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
F_BIGDATA, F_SUBDATA, F_DUPDATA = 0x01, 0x02, 0x04
MAGIC = 0xBEEFC0DE
U16 = struct.Struct("<H")
NODE = struct.Struct("<HHHH")
PAGE = struct.Struct("<QHHHH")  # pgno, pad, flags, lower, upper
DB = struct.Struct("<IHHQQQQQ")  # pad, flags, depth, branch, leaf, overflow, entries, root
META = struct.Struct("<IIQQ")  # magic, version, address, mapsize; then 2 x MDB_db, last_pg, txnid
P_INVALID = (1 << 64) - 1


class PageFile:
    """Bounded page reads (pread, never a map): a page past EOF, or one the disk cannot read (EIO), is None -- it
    costs its own page -- never a signal. Opening the file at all may raise (OSError: an operational error)."""

    def __init__(self, path: str):
        self.fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        self.size = os.fstat(self.fd).st_size
        self.psize = 4096
        self.read_errors = 0

    def read(self, n: int, off: int) -> bytes:
        """Up to ``n`` bytes at ``off`` (b"" past EOF or on a read error)."""
        if off < 0 or n <= 0 or off >= self.size:
            return b""
        try:
            return os.pread(self.fd, min(n, self.size - off), off)
        except OSError:
            self.read_errors += 1
            return b""

    def page(self, pgno: int) -> "bytes | None":
        off = pgno * self.psize
        if pgno < 0 or off + self.psize > self.size:
            return None
        b = self.read(self.psize, off)
        return b if len(b) == self.psize else None

    def close(self):
        os.close(self.fd)


def read_metas(f: PageFile, every: bool = False) -> list:
    """The meta pages LMDB would accept (flags, magic, version), each a dict of its fields; ``every``: both pages,
    each marked ``valid`` or not (a salvage may still read the fields of a page whose magic a flip changed)."""
    out = []
    head = f.read(16 + 136, 0)
    if len(head) < 16 + 136:
        return out
    psize = struct.unpack_from("<I", head, 16 + 24)[0]  # mm_dbs[FREE_DBI].md_pad = mm_psize
    if psize < 256 or psize > 65536 or psize & (psize - 1):
        return out
    f.psize = psize
    for i in (0, 1):
        raw = f.read(16 + 136, i * psize)
        if len(raw) < 16 + 136:
            continue
        pgno, _pad, flags, _lo, _up = PAGE.unpack_from(raw, 0)
        magic, version, addr, mapsize = META.unpack_from(raw, 16)
        valid = bool(flags & P_META) and magic == MAGIC and version == 1
        if not valid and not every:
            continue
        free = DB.unpack_from(raw, 16 + 24)
        main = DB.unpack_from(raw, 16 + 24 + 48)
        last_pg, txnid = struct.unpack_from("<QQ", raw, 16 + 24 + 96)
        # Every walk here is sized by last_pg: never by more pages than the file holds (a flipped field must
        # not make this process allocate terabytes); "last_pg_claimed" keeps what the meta said.
        out.append({"slot": i, "free": free, "main": main, "last_pg": min(last_pg, max(1, f.size // psize - 1)),
                    "last_pg_claimed": last_pg, "txnid": txnid, "pgno": pgno, "flags": flags, "addr": addr,
                    "mapsize": mapsize, "valid": valid})
    return out


class TreeWalk:
    """A bounded walk of one B-tree. Leaf records go to ``on_record(key, value)``; a page that is not sound, out of
    range, reached twice or in ``bad_pages`` is skipped with its subtree (counted in ``skipped``)."""

    def __init__(self, f: PageFile, last_pg: int, seen: bytearray, bad_pages: "set[int] | bytearray | None" = None):
        self.f, self.last_pg, self.seen, self.bad = f, last_pg, seen, bad_pages
        self.skipped = 0
        self.free_hits = 0  # reachable pages the freeDB lists (a damaged pointer, or a damaged free list)
        self.problems: list[str] = []
        self.branch = self.leaf = self.records = self.depth = 0  # what the walk found (vs. the DB record's counters)

    def _note(self, msg: str):
        self.skipped += 1
        if len(self.problems) < 50:
            self.problems.append(msg)

    def walk(self, root: int, depth: int, on_record, lo=None, hi=None,
             leaf_schema: "tuple[int, int] | None" = None, keyfn=None) -> None:
        """``keyfn``: the DB's order as a Python sort key (None: bytes, memcmp order). ``on_record`` None: count."""
        stack = [(root, 32, lo, hi)]  # depth from the DB record is not trusted: 32 bounds the walk (LMDB's own cap)
        kf = keyfn or (lambda k: k)
        fast = None
        if leaf_schema is not None and keyfn is None:  # every node of a sound leaf of this schema has this header
            ks, ds = leaf_schema
            fast = (ks, NODE.pack(ds & 0xFFFF, ds >> 16, 0, ks), 8 + ks + ds)
        while stack:
            pgno, left, lo, hi = stack.pop()
            page = self._admit(pgno)
            if page is None:
                continue
            buf, flags, upper, n = page
            self.depth = max(self.depth, 33 - left)
            kind = flags & ~P_DIRTY
            if kind == P_LEAF and fast is not None and n and self._fast_leaf(fast, buf, n, upper, lo, hi, on_record):
                continue
            if kind == P_BRANCH:
                self._branch(pgno, buf, n, upper, left, lo, hi, kf, stack)
            elif kind == P_LEAF:
                self._leaf(pgno, buf, n, upper, lo, hi, leaf_schema, kf, on_record)
            else:
                self._note(f"page {pgno}: flags {flags:#x} are no tree page")

    def _admit(self, pgno: int) -> "tuple[bytes, int, int, int] | None":
        """(the page's bytes, flags, upper, node count), or None (noted) for a page out of range, reached twice,
        listed as free, past the end of the file or whose header does not hold: it is skipped with its subtree."""
        if not 2 <= pgno <= self.last_pg:
            self._note(f"page number {pgno} out of range")
            return None
        if self.seen[pgno]:
            self._note(f"page {pgno} reached twice")
            return None
        self.seen[pgno] = 1
        if self.bad is not None and self.bad[pgno]:
            self.free_hits += 1
            self._note(f"page {pgno} is listed as free")
            return None
        buf = self.f.page(pgno)
        if buf is None:
            self._note(f"page {pgno} beyond the end of the file")
            return None
        stored, _pad, flags, lower, upper = PAGE.unpack_from(buf, 0)
        if stored != pgno or lower < PHDR or upper > self.f.psize or lower > upper:
            self._note(f"page {pgno}: bad header")
            return None
        return buf, flags, upper, (lower - PHDR) >> 1

    def _fast_leaf(self, fast: tuple, buf: bytes, n: int, upper: int, lo, hi, on_record) -> bool:
        """The fast path (the check's cost is this loop): offsets in bounds, every node header the schema's, keys
        strictly increasing and inside the parent's bounds. False: anything else, for the node-by-node path."""
        ks, node_hdr, rec_end = fast
        offs = struct.unpack_from(f"<{n}H", buf, PHDR)
        if not (min(offs) >= upper and max(offs) + rec_end <= self.f.psize and
                all(buf[o:o + 8] == node_hdr for o in offs)):
            return False
        keys = [buf[o + 8:o + 8 + ks] for o in offs]
        if not (all(map(bytes.__lt__, keys, keys[1:])) and (lo is None or not keys[0] < lo) and
                (hi is None or keys[-1] < hi)):
            return False
        self.leaf += 1
        self.records += n
        if on_record is not None:
            for o, k in zip(offs, keys):
                on_record(k, 0, buf[o + 8 + ks:o + rec_end])
        return True

    def _branch(self, pgno: int, buf: bytes, n: int, upper: int, left: int, lo, hi, kf, stack: list) -> None:
        """A branch page's children onto ``stack``, each with its key bounds; none where a node is out of bounds or
        the separators are out of order (the page is skipped with its subtree)."""
        psize = self.f.psize
        if left <= 1 or n < 1:
            self._note(f"page {pgno}: branch deeper than its DB's depth, or empty")
            return
        kids = []
        for i in range(n):
            o = U16.unpack_from(buf, PHDR + 2 * i)[0]
            if o < upper or o + 8 > psize:
                self._note(f"page {pgno}: branch node out of bounds")
                return
            nlo, nhi, nfl, ks = NODE.unpack_from(buf, o)
            if o + 8 + ks > psize:
                self._note(f"page {pgno}: branch node out of bounds")
                return
            kids.append((nlo | nhi << 16 | nfl << 32, kf(bytes(buf[o + 8:o + 8 + ks])) if i else None))
        # Child i holds keys in [sep_i, sep_{i+1}), within the parent's own bounds.
        seps = [lo] + [k for _, k in kids[1:]] + [hi]
        if any(seps[i] is not None and seps[i + 1] is not None and not seps[i] < seps[i + 1]
               for i in range(len(seps) - 1)):
            self._note(f"page {pgno}: separators out of order")
            return
        self.branch += 1
        for i in range(len(kids) - 1, -1, -1):
            stack.append((kids[i][0], left - 1, seps[i], seps[i + 1]))

    def _leaf(self, pgno: int, buf: bytes, n: int, upper: int, lo, hi, leaf_schema, kf, on_record) -> None:
        """A leaf node by node: each node is self-delimited, so one out of bounds, of another schema, outside the
        parent's bounds or out of order costs only itself."""
        psize = self.f.psize
        recs = []
        for i in range(n):
            o = U16.unpack_from(buf, PHDR + 2 * i)[0]
            if o < upper or o + 8 > psize:
                self._note(f"page {pgno} node {i}: out of bounds")
                continue
            nlo, nhi, nfl, ks = NODE.unpack_from(buf, o)
            ds = nlo | nhi << 16
            if o + 8 + ks + (8 if nfl & F_BIGDATA else ds) > psize:
                self._note(f"page {pgno} node {i}: overruns the page")
                continue
            key = bytes(buf[o + 8:o + 8 + ks])
            if leaf_schema is not None and (ks != leaf_schema[0] or ds != leaf_schema[1] or nfl):
                self._note(f"page {pgno} node {i}: not a {leaf_schema} record")
                continue
            k = kf(key)
            if (lo is not None and k < lo) or (hi is not None and not k < hi):
                self._note(f"page {pgno} node {i}: key outside its parent's bounds")
                continue
            recs.append((k, key, nfl, bytes(buf[o + 8 + ks:o + 8 + ks + (8 if nfl & F_BIGDATA else ds)])))
        keep = longest_increasing(recs)
        if len(keep) < len(recs):
            self._note(f"page {pgno}: {len(recs) - len(keep)} key(s) out of order")
        self.leaf += 1
        self.records += len(keep)
        if on_record is not None:
            for _, key, nfl, val in keep:
                on_record(key, nfl, val)


def longest_increasing(recs: list) -> list:
    """The longest strictly increasing run (by ``rec[0]``, not necessarily contiguous) of a leaf's records: a damaged
    key that breaks the order is dropped, not its healthy neighbour (an LMDB leaf is sorted)."""
    if all(recs[i][0] < recs[i + 1][0] for i in range(len(recs) - 1)):
        return recs
    tails: list = []  # tails[j]: index of the smallest last key of an increasing run of length j + 1
    prev = [-1] * len(recs)
    for i, r in enumerate(recs):
        j = bisect.bisect_left([recs[t][0] for t in tails], r[0])
        prev[i] = tails[j - 1] if j else -1
        if j == len(tails):
            tails.append(i)
        else:
            tails[j] = i
    out, i = [], tails[-1] if tails else -1
    while i >= 0:
        out.append(recs[i])
        i = prev[i]
    return out[::-1]


def free_pages(f: PageFile, meta: dict, seen: "bytearray | None" = None) -> "tuple[bytearray, set, list]":
    """Pages the freeDB lists (bitmap), the txnids of its records, problems (none: the freeDB walked clean). Its own
    tree and overflow pages are marked in ``seen``. Every read is bounded."""
    last_pg = meta["last_pg"]
    free = bytearray(last_pg + 1)
    keys: set[int] = set()
    seen = bytearray(last_pg + 1) if seen is None else seen
    root, depth = meta["free"][7], meta["free"][2]
    problems: list[str] = []
    if root == P_INVALID:
        return free, keys, []

    def rec(key, nfl, val):
        if len(key) != 8:
            return
        keys.add(int.from_bytes(key, "little"))
        data = val
        if nfl & F_BIGDATA:
            pg = int.from_bytes(val[:8], "little")
            first = f.page(pg) if 2 <= pg <= last_pg else None
            if first is None:
                return
            npages = struct.unpack_from("<I", first, 12)[0]
            if not 1 <= npages <= last_pg - pg + 1 or struct.unpack_from("<Q", first, 0)[0] != pg:
                problems.append(f"freeDB overflow page {pg} is not one")
                return
            for q in range(pg, pg + npages):
                seen[q] = 1
            data = f.read(npages * f.psize, pg * f.psize)[PHDR:]
        if len(data) < 8:
            problems.append("freeDB record too short")
            return
        count = int.from_bytes(data[:8], "little")
        if count > len(data) // 8 - 1:
            problems.append("freeDB record count beyond its value")
            count = len(data) // 8 - 1
        prev = None
        for i in range(1, count + 1):
            p = int.from_bytes(data[8 * i:8 * i + 8], "little")
            if prev is not None and not p < prev:
                problems.append("freeDB record not strictly descending")
            prev = p
            if not 2 <= p <= last_pg:
                problems.append("freeDB lists a page out of range")
            elif free[p]:
                problems.append(f"freeDB lists page {p} twice")
            else:
                free[p] = 1

    ovf = [0]
    w = TreeWalk(f, last_pg, seen)

    def rec_counted(key, nfl, val):
        if nfl & F_BIGDATA and len(val) >= 8:
            pg = int.from_bytes(val[:8], "little")
            first = f.page(pg) if 2 <= pg <= last_pg else None
            if first is not None:
                ovf[0] += max(0, struct.unpack_from("<I", first, 12)[0])
        rec(key, nfl, val)

    w.walk(root, depth, rec_counted, keyfn=lambda k: int.from_bytes(k, "little") if len(k) == 8 else -1)
    _pad, _fl, d, b, lf, o, e, _r = meta["free"]
    if (d, b, lf, o, e) != (w.depth, w.branch, w.leaf, ovf[0], w.records):
        problems.append(f"freeDB record says depth/branch/leaf/overflow/entries {d}/{b}/{lf}/{o}/{e}, the walk "
                        f"found {w.depth}/{w.branch}/{w.leaf}/{ovf[0]}/{w.records}")
    return free, keys, w.problems + problems


def meta_problems(ms: list, f: PageFile) -> "list[str]":
    """What LMDB's open (mdb_env_read_header, mdb_env_pick_meta, the DB flag checks) and this index's fixed shape
    require of the two meta pages; the check refuses a file with any of it off, the open would (raise, map
    terabytes, or pick the older snapshot)."""
    if len(ms) != 2:
        return ["a meta page is not one (flags, magic or version)"]
    out = []
    for m in ms:
        i = m["slot"]
        if m["pgno"] != i or m["flags"] != P_META or m["addr"] != 0:
            out.append(f"meta {i}: page number, flags or address off")
        if m["free"][0] != f.psize or m["free"][1] != 0x08 or m["main"][0] != 0 or m["main"][1] != 0:
            out.append(f"meta {i}: page size or DB flags off")
        if not (m["last_pg_claimed"] + 1) * f.psize <= m["mapsize"] <= 1 << 46:
            out.append(f"meta {i}: map size {m['mapsize']} implausible")
        if m["txnid"] and (m["txnid"] & 1) != i:
            out.append(f"meta {i}: txnid {m['txnid']} of the wrong parity")
    t0, t1 = ms[0]["txnid"], ms[1]["txnid"]
    if abs(t0 - t1) != 1 and not t0 == t1 == 0:
        out.append(f"meta txnids {t0} and {t1} are not consecutive")
    return out


def newest_meta(f: PageFile, ms: list, info: dict) -> "dict | None":
    """For a salvage: the meta page of the newest commit, established from two witnesses per page that no single
    flip can both change -- its txnid field and what its trees say (a commit's own freed pages are its freeDB's
    highest record, keyed by its txnid) -- and from how LMDB writes them: commit ``t`` goes to page ``t & 1``, and the
    two pages hold consecutive commits. Each page's candidates are its witnesses of its parity; the newest is the
    page that every consecutive pairing of candidates names. Where no pairing exists, or two name different pages,
    it is not established: None (nothing is kept; a rollback of one commit would bring its deletes back). So a
    txnid field a flip raised or lowered, a freeDB key a flip raised, and a newest page whose flags, magic or version
    a flip changed (LMDB refuses that file; the one page it would accept is the older) all still give the newest
    commit. ``ms``: both pages (``read_metas(f, every=True)``)."""
    if len(ms) != 2:
        return None
    cands = {}
    for m in ms:
        _, keys, prob = free_pages(f, m)
        tree = max(keys) if keys and not prob else None
        # txnid 0 is the environment LMDB created (both pages, before any commit): a candidate of page 0 only
        cands[m["slot"]] = {t for t in (m["txnid"], tree) if t is not None and t & 1 == m["slot"]}
    named = {(0, a) if a > b else (1, b) for a in cands.get(0, ()) for b in cands.get(1, ()) if abs(a - b) == 1}
    if len(named) != 1:
        return None
    (slot, t), = named
    m = next(m for m in ms if m["slot"] == slot)
    if t != m["txnid"]:
        info["problems"].append(f"meta {slot} claims txnid {m['txnid']}, its trees say {t}: using it as {t}")
    if not m["valid"]:
        info["problems"].append(f"meta {slot} (txnid {t}, the newest) has its flags, magic or version off: its "
                                f"trees are used")
    return dict(m, txnid=t)
