"""No bytes in the index file may crash the process that opens it.

LMDB maps ``data.mdb`` and trusts every page number, offset and length in it: a flipped byte can send the engine past
the end of the file (SIGBUS), outside the map (SIGSEGV) or into an assertion (SIGABRT), at open, in the cold-start
walk, in a lookup or in a later write, and no caller can catch a signal. So a process must not map a file nobody has
proven sound, and the proof must be made by code that cannot crash on it. This module makes it, around a process's
first ``lmdb.open`` of an index (:func:`guarded`, called by ``L3Index.open``); it imports only the standard library,
``lmdb`` and the config's mode names (``config_table``, standard library only).

1. **Gate** (node-wide: the index is one file for every rank and deployment of the node). ``flock(index.gate)``,
   held from before the check until this process's own ``lmdb.open`` returned, serialises the first opens of every
   process of this build. Whether anybody has the environment open is LMDB's own test: every opener (any build, any
   tool) holds a POSIX read lock on byte 0 of ``lock.mdb``. A process that gets that byte exclusively is alone: it
   checks (and repairs) the file while holding it, so any LMDB opener waits in its open. Otherwise live processes
   have it mapped: the first of them proved it, every write since was made by LMDB in such processes, so it is not
   checked again (``in_use``), nor could it be replaced under their maps.
2. **Check** (:func:`check_index`) by byte walkers that never map the file and bound every read (pread; page
   numbers, offsets and lengths checked against the page and the file; the visited-page bitmap sized by the file,
   never by a field):
   * ``fast`` (default): this module's schema-exact walk -- both meta pages as LMDB's open requires them and the
     committed one provably the newest (its commit's own freed pages are in its freeDB under its txnid: a txnid a
     flip raised, which LMDB would take for the newest, a silent rollback of one commit, fails); the freeDB, main
     DB and ``pages`` trees: every page reached once, never a free one, its own page number, every node inside its
     page, every record the index's 57-byte key / 16-byte value, keys in order and inside their parent's separator
     bounds, each DB record's counters equal to what the walk found. ~0.35 s per million entries;
   * ``full``: also py-lmdb's offline verifier ``lmdb.verify`` (py-lmdb >= 3.0; seek/read only; every engine
     invariant, including that live and free pages cover the file) in a child process beside the walk. ~1.3 s per
     million entries more CPU.
3. **Damaged** (``on_damage``): the file is moved aside (``data.mdb.damaged-<utc>-<pid>``, never deleted: the
   operator may inspect it) and a fresh index is written with every record that can be proven (``salvage``, the
   default: :func:`salvage_records`) or none (``reset``); ``refuse`` (fsck without ``--repair``, read-only opens)
   changes nothing and raises :class:`Damaged` with the findings and what a salvage would keep.

What a salvage keeps: the records of the committed tree's leaves that the bounded walk finds sound, reachable through
sound branch pages and inside their parent's key bounds; plus, when the free list walked clean, leaves that are
neither reachable nor free (at rest every page is one or the other: such a leaf was live until a pointer to it was
damaged). Never a page the freeDB names (an old copy of a leaf: it holds entries a ``clear``, ``free`` or GC deleted,
and such a blob still verifies byte-exact, so nothing downstream could catch its return), never a page reached
twice, never the older meta's snapshot. Which meta is the newest is decided by two witnesses per page that no one
flip can both change -- its txnid field and what its trees say (a commit's own freed pages are its freeDB's highest
record, keyed by its txnid) -- paired across the two pages as LMDB writes them (commit ``t`` on page ``t & 1``, the
pages holding consecutive commits), also for a page whose flags, magic or version a flip changed; when no pairing,
or more than one, names a page, it is not established and nothing is kept (:func:`_newest_meta`). Slabs are never
scanned to rebuild entries: a slot's header has no epoch, so a blob a ``clear`` dropped is indistinguishable from a
live one (l3_design.md, "A damaged index").

Entries stay pointers: every reload verifies the slot's header (kind, content hash, namespace + deployment digest)
and the payload checksum, so a damaged entry that survived is a miss, never wrong bytes.

The walkers know LMDB 0.9's file layout on a 64-bit little-endian host (as ``lmdb.verify`` does); a file of another
layout (an LMDB 1.0 environment) fails the meta check and is treated as damaged.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import fcntl
import json
import os
import struct
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field

# The config's index.check / index.on_damage values (a server's open); tools may also "refuse" a damaged index.
from ..config_table import INDEX_CHECK_MODES as CHECK_MODES, INDEX_ON_DAMAGE as ON_DAMAGE

__all__ = ["CHECK_MODES", "ON_DAMAGE", "GATE_FILE", "Verdict", "Damaged", "check_index", "salvage_records",
           "rebuild_index", "guarded"]

GATE_FILE = "index.gate"
GATE_TIMEOUT_S = 600.0  # a first opener checks ~1-3 s per million entries (full); the others wait this long at most
_DB_NAME = b"pages"
_KEY_LEN = 57  # engine/index.py's KEY_LEN and VALUE_LEN (tests/l3/engine/test_index_bitrot.py checks they agree)
_VALUE_LEN = 16


@dataclass
class Verdict:
    """What the guard found and did at a process's first open of an index."""

    action: str  # "verified" | "in_use" (live processes have it open) | "new" | "salvaged" | "reset"
    reason: str = ""
    problems: list = field(default_factory=list)  # the check's findings (damaged files; at most 20)
    kept: int = 0  # salvaged: the entries the new index holds
    claimed: int = 0  # salvaged: the entries the damaged file's pages DB record claimed (itself perhaps damaged)
    moved_to: str = ""  # salvaged / reset: where the damaged file went
    seconds: dict = field(default_factory=dict)

    @property
    def repaired(self) -> bool:
        return self.action in ("salvaged", "reset")

    def as_dict(self) -> dict:
        return asdict(self)


class Damaged(OSError):
    """The index is damaged and ``on_damage = "refuse"``: nothing was changed. ``records`` is what a salvage would
    keep (sorted (key, value) pairs, read with pread), ``claimed`` the entry count the file's own record claims."""

    def __init__(self, reason: str, problems: list, records: list, claimed: int):
        super().__init__(reason)
        self.reason, self.problems, self.records, self.claimed = reason, problems, records, claimed


# ------------------------------------------------------------------------------------------------ the check
_VERIFY_CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from lmdb import verify
try:
    print(json.dumps(verify.verify(sys.argv[2], subdir=True)))
except verify.VerifyError as e:
    print(json.dumps(["unverifiable: %s" % e]))
"""


def _verifier_child(path: str) -> subprocess.Popen:
    """``lmdb.verify`` in a child that imports only the lmdb binding this process runs (``-I``: no user site, no
    environment, no project code) and prints its findings as JSON."""
    import importlib.util

    import lmdb
    if importlib.util.find_spec("lmdb.verify") is None:  # the config refuses "full" then; a direct caller learns here
        raise OSError("L3 index: index.check = 'full' runs lmdb.verify, which this py-lmdb lacks (needs lmdb>=3.0)")
    where = os.path.dirname(os.path.dirname(os.path.abspath(lmdb.__file__)))
    return subprocess.Popen([sys.executable, "-I", "-c", _VERIFY_CHILD, where, path], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, close_fds=True)


def check_index(path: str, mode: str = "fast", timeout: float = GATE_TIMEOUT_S) -> "tuple[bool, list[str]]":
    """(sound, findings) for the index directory ``path``, which nobody may be writing (the guard holds LMDB's
    exclusive lock). Never raises for any file content; OSError where the check itself cannot run (``data.mdb``
    cannot be opened, the verifier child cannot start or was killed): then nothing may be concluded, nor replaced."""
    if mode not in CHECK_MODES:
        raise ValueError(f"index check mode {mode!r}: expected one of {CHECK_MODES}")
    proc = _verifier_child(path) if mode == "full" else None
    try:
        _, info = salvage_records(os.path.join(path, "data.mdb"), collect=False)
        problems = list(info["problems"])
        if not problems and info["walked"] != info["claimed"]:
            problems.append(f"the walk found {info['walked']} entries, the pages DB record claims {info['claimed']}")
        if problems or proc is None:
            return not problems, problems
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False, [f"lmdb.verify did not finish in {timeout:g} s"]
        if proc.returncode < 0:  # pure Python cannot fault on a file: the machine killed it (OOM), not damage
            raise OSError(f"L3 index {path}: the lmdb.verify child was killed by signal {-proc.returncode}")
        if proc.returncode != 0:
            return False, [f"lmdb.verify failed (exit {proc.returncode}): {err.strip()[-300:]}"]
        try:
            found = json.loads(out)
        except ValueError:
            return False, [f"lmdb.verify answered no findings list: {out[-200:]!r}"]
        return not found, [f"lmdb.verify: {p}" for p in found]
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()


# ------------------------------------------------------------------------------------------------ the walker
# LMDB 0.9, 64-bit, native (little-endian) layout: page header 16 bytes, node header 8 bytes.
_PHDR = 16
_P_BRANCH, _P_LEAF, _P_OVERFLOW, _P_META, _P_DIRTY, _P_LEAF2 = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
_F_BIGDATA, _F_SUBDATA, _F_DUPDATA = 0x01, 0x02, 0x04
_MAGIC = 0xBEEFC0DE
_U16 = struct.Struct("<H")
_NODE = struct.Struct("<HHHH")
_PAGE = struct.Struct("<QHHHH")  # pgno, pad, flags, lower, upper
_DB = struct.Struct("<IHHQQQQQ")  # pad, flags, depth, branch, leaf, overflow, entries, root
_META = struct.Struct("<IIQQ")  # magic, version, address, mapsize; then 2 x MDB_db, last_pg, txnid
_P_INVALID = (1 << 64) - 1


class _File:
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


def _metas(f: _File, every: bool = False) -> list:
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
        pgno, _pad, flags, _lo, _up = _PAGE.unpack_from(raw, 0)
        magic, version, addr, mapsize = _META.unpack_from(raw, 16)
        valid = bool(flags & _P_META) and magic == _MAGIC and version == 1
        if not valid and not every:
            continue
        free = _DB.unpack_from(raw, 16 + 24)
        main = _DB.unpack_from(raw, 16 + 24 + 48)
        last_pg, txnid = struct.unpack_from("<QQ", raw, 16 + 24 + 96)
        # Every walk here is sized by last_pg: never by more pages than the file holds (a flipped field must
        # not make this process allocate terabytes); "last_pg_claimed" keeps what the meta said.
        out.append({"slot": i, "free": free, "main": main, "last_pg": min(last_pg, max(1, f.size // psize - 1)),
                    "last_pg_claimed": last_pg, "txnid": txnid, "pgno": pgno, "flags": flags, "addr": addr,
                    "mapsize": mapsize, "valid": valid})
    return out


class _Walk:
    """A bounded walk of one B-tree. Leaf records go to ``on_record(key, value)``; a page that is not sound, out of
    range, reached twice or in ``bad_pages`` is skipped with its subtree (counted in ``skipped``)."""

    def __init__(self, f: _File, last_pg: int, seen: bytearray, bad_pages: "set[int] | bytearray | None" = None):
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
        f = self.f
        psize = f.psize
        fast = leaf_schema is not None and keyfn is None
        if fast:  # every node of a sound leaf of this schema has this very 8-byte header
            ks_, ds_ = leaf_schema
            node_hdr = _NODE.pack(ds_ & 0xFFFF, ds_ >> 16, 0, ks_)
            rec_end = 8 + ks_ + ds_
            lt = bytes.__lt__
        while stack:
            pgno, left, lo, hi = stack.pop()
            if not 2 <= pgno <= self.last_pg:
                self._note(f"page number {pgno} out of range")
                continue
            if self.seen[pgno]:
                self._note(f"page {pgno} reached twice")
                continue
            self.seen[pgno] = 1
            if self.bad is not None and self.bad[pgno]:
                self.free_hits += 1
                self._note(f"page {pgno} is listed as free")
                continue
            buf = f.page(pgno)
            if buf is None:
                self._note(f"page {pgno} beyond the end of the file")
                continue
            stored, _pad, flags, lower, upper = _PAGE.unpack_from(buf, 0)
            if stored != pgno or lower < _PHDR or upper > psize or lower > upper:
                self._note(f"page {pgno}: bad header")
                continue
            n = (lower - _PHDR) >> 1
            self.depth = max(self.depth, 33 - left)
            if flags & ~_P_DIRTY == _P_LEAF and fast and n:
                # The fast path (the check's cost is this loop): offsets in bounds, every node header the schema's,
                # keys strictly increasing and inside the parent's bounds. Anything else: the node-by-node path.
                offs = struct.unpack_from(f"<{n}H", buf, _PHDR)
                if min(offs) >= upper and max(offs) + rec_end <= psize and \
                        all(buf[o:o + 8] == node_hdr for o in offs):
                    keys = [buf[o + 8:o + 8 + ks_] for o in offs]
                    if all(map(lt, keys, keys[1:])) and (lo is None or not keys[0] < lo) and \
                            (hi is None or keys[-1] < hi):
                        self.leaf += 1
                        self.records += n
                        if on_record is not None:
                            for o, k in zip(offs, keys):
                                on_record(k, 0, buf[o + 8 + ks_:o + rec_end])
                        continue
            if flags & ~_P_DIRTY == _P_BRANCH:
                if left <= 1 or n < 1:
                    self._note(f"page {pgno}: branch deeper than its DB's depth, or empty")
                    continue
                kids = []
                for i in range(n):
                    o = _U16.unpack_from(buf, _PHDR + 2 * i)[0]
                    if o < upper or o + 8 > psize:
                        kids = None
                        break
                    nlo, nhi, nfl, ks = _NODE.unpack_from(buf, o)
                    if o + 8 + ks > psize:
                        kids = None
                        break
                    kids.append((nlo | nhi << 16 | nfl << 32, kf(bytes(buf[o + 8:o + 8 + ks])) if i else None))
                if kids is None:
                    self._note(f"page {pgno}: branch node out of bounds")
                    continue
                # Child i holds keys in [sep_i, sep_{i+1}), within the parent's own bounds.
                seps = [lo] + [k for _, k in kids[1:]] + [hi]
                if any(seps[i] is not None and seps[i + 1] is not None and not seps[i] < seps[i + 1]
                       for i in range(len(seps) - 1)):
                    self._note(f"page {pgno}: separators out of order")
                    continue
                self.branch += 1
                for i in range(len(kids) - 1, -1, -1):
                    stack.append((kids[i][0], left - 1, seps[i], seps[i + 1]))
            elif flags & ~_P_DIRTY == _P_LEAF:
                recs = []
                for i in range(n):  # each node is self-delimited: one out of bounds costs only itself
                    o = _U16.unpack_from(buf, _PHDR + 2 * i)[0]
                    if o < upper or o + 8 > psize:
                        self._note(f"page {pgno} node {i}: out of bounds")
                        continue
                    nlo, nhi, nfl, ks = _NODE.unpack_from(buf, o)
                    ds = nlo | nhi << 16
                    if o + 8 + ks + (8 if nfl & _F_BIGDATA else ds) > psize:
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
                    recs.append((k, key, nfl, bytes(buf[o + 8 + ks:o + 8 + ks + (8 if nfl & _F_BIGDATA else ds)])))
                keep = _increasing(recs)
                if len(keep) < len(recs):
                    self._note(f"page {pgno}: {len(recs) - len(keep)} key(s) out of order")
                recs = keep
                self.leaf += 1
                self.records += len(recs)
                if on_record is not None:
                    for _, key, nfl, val in recs:
                        on_record(key, nfl, val)
            else:
                self._note(f"page {pgno}: flags {flags:#x} are no tree page")


def _increasing(recs: list) -> list:
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


def _free_pages(f: _File, meta: dict, seen: "bytearray | None" = None) -> "tuple[bytearray, set, list]":
    """Pages the freeDB lists (bitmap), the txnids of its records, problems (none: the freeDB walked clean). Its own
    tree and overflow pages are marked in ``seen``. Every read is bounded."""
    last_pg = meta["last_pg"]
    free = bytearray(last_pg + 1)
    keys: set[int] = set()
    seen = bytearray(last_pg + 1) if seen is None else seen
    root, depth = meta["free"][7], meta["free"][2]
    problems: list[str] = []
    if root == _P_INVALID:
        return free, keys, []

    def rec(key, nfl, val):
        if len(key) != 8:
            return
        keys.add(int.from_bytes(key, "little"))
        data = val
        if nfl & _F_BIGDATA:
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
            data = f.read(npages * f.psize, pg * f.psize)[_PHDR:]
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
    w = _Walk(f, last_pg, seen)

    def rec_counted(key, nfl, val):
        if nfl & _F_BIGDATA and len(val) >= 8:
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


def _meta_problems(ms: list, f: _File) -> "list[str]":
    """What LMDB's open (mdb_env_read_header, mdb_env_pick_meta, the DB flag checks) and this index's fixed shape
    require of the two meta pages; the check refuses a file with any of it off, the open would (raise, map
    terabytes, or pick the older snapshot)."""
    if len(ms) != 2:
        return ["a meta page is not one (flags, magic or version)"]
    out = []
    for m in ms:
        i = m["slot"]
        if m["pgno"] != i or m["flags"] != _P_META or m["addr"] != 0:
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

def _newest_meta(f: _File, ms: list, info: dict) -> "dict | None":
    """For a salvage: the meta page of the newest commit, established from two witnesses per page that no single
    flip can both change -- its txnid field and what its trees say (a commit's own freed pages are its freeDB's
    highest record, keyed by its txnid) -- and from how LMDB writes them: commit ``t`` goes to page ``t & 1``, and the
    two pages hold consecutive commits. Each page's candidates are its witnesses of its parity; the newest is the
    page that every consecutive pairing of candidates names. Where no pairing exists, or two name different pages,
    it is not established: None (nothing is kept; a rollback of one commit would bring its deletes back). So a
    txnid field a flip raised or lowered, a freeDB key a flip raised, and a newest page whose flags, magic or version
    a flip changed (LMDB refuses that file; the one page it would accept is the older) all still give the newest
    commit. ``ms``: both pages (``_metas(f, every=True)``)."""
    if len(ms) != 2:
        return None
    cands = {}
    for m in ms:
        _, keys, prob = _free_pages(f, m)
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


def salvage_records(data_path: str, collect: bool = True) -> "tuple[list[tuple[bytes, bytes]], dict]":
    """Every ``pages`` record of the committed tree that a bounded byte walk can prove (module docstring, 3.),
    sorted by key, unique. Never raises for any file content (OSError only where the file cannot be opened at all);
    ([], info) when nothing can be proven.

    ``collect=False`` is the check: the same walk, counting records instead of keeping them (``info["walked"]``),
    no orphan adoption. It adds to lmdb.verify what a search relies on and the verifier does not look at: every
    record lies inside its parent's separator bounds (a separator changed within its siblings' order sends a
    lookup to the wrong leaf: a miss, and an insert there a second copy of a key), the committed meta is provably
    the newest, and the ``pages`` records are this index's 57-byte keys and 16-byte values."""
    info: dict = {"claimed": 0, "problems": [], "walked": 0, "adopted": 0}
    f = _File(data_path)
    try:
        ms = _metas(f, every=True)
        valid = [x for x in ms if x["valid"]]
        if not collect:
            if not valid:
                info["problems"].append("no valid meta page")
                return [], info
            m = max(valid, key=lambda x: x["txnid"])  # the page LMDB's open picks
            info["problems"] += _meta_problems(valid, f)
        else:
            m = _newest_meta(f, ms, info)
            if m is None:
                info["problems"].append("which meta page holds the newest commit cannot be established (txnid fields "
                                        "and trees disagree): nothing is proven")
                return [], info
        if m["last_pg_claimed"] != m["last_pg"]:
            info["problems"].append("the committed meta names pages past the end of the file (truncated, or a "
                                    "damaged meta): what lies beyond is lost")
        seen = bytearray(m["last_pg"] + 1)
        free, fkeys, fprob = _free_pages(f, m, seen)
        info["problems"] += fprob[:10]
        if m["txnid"] > 1 and m["txnid"] not in fkeys:
            info["problems"].append(f"the committed meta (txnid {m['txnid']}) is not proven newest")
            return [], info
        subdbs = []

        def main_rec(key, nfl, val):
            if key == _DB_NAME and nfl & _F_SUBDATA and len(val) == 48:
                subdbs.append(_DB.unpack_from(val, 0))

        root, depth = m["main"][7], m["main"][2]
        if root == _P_INVALID:
            return [], info
        w = _Walk(f, m["last_pg"], seen, free)
        w.walk(root, depth, main_rec)
        info["problems"] += w.problems[:10]
        _pad, _fl, d, b, lf, o, e, _r = m["main"]
        if (d, b, lf, o, e) != (w.depth, w.branch, w.leaf, 0, w.records):
            info["problems"].append(f"main DB record says depth/branch/leaf/overflow/entries {d}/{b}/{lf}/{o}/{e}, "
                                    f"the walk found {w.depth}/{w.branch}/{w.leaf}/0/{w.records}")
        if len(subdbs) != 1:
            info["problems"].append("the pages DB record is missing or damaged")
            return [], info
        db = subdbs[0]
        info["claimed"] = db[6]
        if db[7] == _P_INVALID:
            return [], info
        recs: list[tuple[bytes, bytes]] = []
        w = _Walk(f, m["last_pg"], seen, free)
        if collect:
            w.walk(db[7], db[2], lambda k, nfl, v: recs.append((k, v)), leaf_schema=(_KEY_LEN, _VALUE_LEN))
        else:
            w.walk(db[7], db[2], None, leaf_schema=(_KEY_LEN, _VALUE_LEN))
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
        if not collect:
            return [], info
        info["walked"] = len(recs)
        if w.skipped and not fprob and not w.free_hits:
            # Orphans: with a clean freeDB (and the metas proven), every page up to last_pg is either reachable or
            # free; a leaf that is neither was reachable in the committed tree until a pointer to it was damaged.
            # Its records are committed entries: adopt them (a free page -- deleted entries -- never is). Not when
            # the free set is in doubt: a damaged free-list entry would make a freed leaf look like an orphan (a
            # changed page number lands on a live page -- reachable and free -- or a free one -- listed twice --,
            # both refused here, unless it lands in the lost subtree: two related flips).
            have = {k for k, _ in recs}
            for p in range(2, m["last_pg"] + 1):
                if seen[p] or free[p]:
                    continue
                buf = f.page(p)
                if buf is None:
                    continue
                stored, _pad, flags, _lo, _up = _PAGE.unpack_from(buf, 0)
                if stored != p or flags & ~_P_DIRTY != _P_LEAF:
                    continue
                got: list = []
                ow = _Walk(f, m["last_pg"], seen, free)
                ow.walk(p, 1, lambda k, nfl, v: got.append((k, v)), leaf_schema=(_KEY_LEN, _VALUE_LEN))
                new = [(k, v) for k, v in got if k not in have]
                recs += new
                have.update(k for k, _ in new)
                info["adopted"] += len(new)
        recs.sort()
        out = [r for i, r in enumerate(recs) if i == 0 or r[0] != recs[i - 1][0]]
        return out, info
    except Exception as e:  # bounded reads leave nothing expected here; whatever it is, nothing is proven
        info["problems"].append(f"salvage stopped: {type(e).__name__}: {e}")
        return [], info
    finally:
        f.close()


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
            db = env.open_db(_DB_NAME, create=True)
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


# ------------------------------------------------------------------------------------------------ the gate
def _lock(fd: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def _alone(path: str) -> "int | None":
    """LMDB's own "first opener" test: every process with the environment open holds a POSIX read lock on byte 0 of
    ``lock.mdb`` (mdb_env_excl_lock), whatever its build or tool. An fd holding that byte exclusively means nobody
    has it open, and while it is held any LMDB opener waits in its open. None: someone has it open.

    Only for a process that does not have the environment open itself (POSIX locks are per process, and closing any
    fd of the file drops them): L3Index.open calls the guard only for its process's first open of the path."""
    fd = os.open(os.path.join(path, "lock.mdb"), os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
        return fd
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EACCES, errno.EAGAIN):
            return None
        raise


def _require_known_layout() -> None:
    """The walkers read LMDB 0.9's file layout on a 64-bit little-endian host. Another engine (py-lmdb can be built
    with LMDB 1.0, whose files differ) would have every file refused as damaged and replaced at every start: refuse
    to open instead, with the fix."""
    import lmdb
    ver = lmdb.version()
    if ver[:2] != (0, 9) or sys.byteorder != "little" or struct.calcsize("P") != 8:
        raise OSError(f"L3 index: this py-lmdb runs LMDB {'.'.join(map(str, ver))} on a "
                      f"{struct.calcsize('P') * 8}-bit {sys.byteorder}-endian host; the index check reads LMDB "
                      f"0.9's file layout on 64-bit little-endian hosts only: install an lmdb wheel built with its "
                      f"default LMDB 0.9 engine (pip install --force-reinstall 'lmdb>=3.0')")


def _has_data(path: str) -> bool:
    try:
        return os.path.getsize(os.path.join(path, "data.mdb")) > 0
    except FileNotFoundError:
        return False


@contextlib.contextmanager
def guarded(path: str, *, check: str = "fast", on_damage: str = "salvage", map_size: int = 1 << 30,
            timeout: float = GATE_TIMEOUT_S, log=None):
    """Wrap a process's first ``lmdb.open`` of the index directory ``path`` (which must exist): yields the
    :class:`Verdict` once the file the open will map is proven sound (checked, repaired, new, or in use by live
    processes), and holds the node's gate until the block ends, so the next process finds this one's open and does
    not check again. Raises :class:`Damaged` (``on_damage = "refuse"``) or OSError (the gate, a file that cannot be
    opened, a repair that could not be written: then nothing was changed)."""
    if on_damage not in ON_DAMAGE + ("refuse",):
        raise ValueError(f"on_damage {on_damage!r}: expected one of {ON_DAMAGE + ('refuse',)}")
    if check not in CHECK_MODES:
        raise ValueError(f"index check mode {check!r}: expected one of {CHECK_MODES}")
    _require_known_layout()
    if not _has_data(path):  # LMDB makes a new environment: nothing to prove (a zero-length file is LMDB's "new" too)
        yield Verdict("new", "no data yet")
        return
    gate = os.open(os.path.join(path, GATE_FILE), os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        if not _lock(gate, timeout):
            raise OSError(errno.ETIMEDOUT, f"L3 index {path}: another process has held {GATE_FILE} (checking the "
                                           f"index) for more than {timeout:g} s")
        held = _alone(path)
        if held is None:
            yield Verdict("in_use", "live processes have it open (the first of them checked it)")
            return
        try:
            verdict = _check_and_repair(path, check, on_damage, map_size, timeout, log)
        finally:
            os.close(held)  # the next opener (this process's, in the block) is LMDB's exclusive one: it resets lock.mdb
        yield verdict
    finally:
        os.close(gate)


def _check_and_repair(path: str, mode: str, on_damage: str, map_size: int, timeout: float, log) -> Verdict:
    t0 = time.perf_counter()
    if not _has_data(path):
        return Verdict("new", "no data yet")
    try:
        ok, problems = check_index(path, mode, timeout)
    except OSError:
        raise  # the check itself could not run: an operational error, nothing concluded about the file
    except Exception as e:  # the walkers bound every read; anything left is a finding, never a failed open
        ok, problems = False, [f"the check stopped: {type(e).__name__}: {e}"]
    t1 = time.perf_counter()
    if ok:
        if log is not None:
            log.info("L3 index %s: checked (%s) in %.2f s: sound", path, mode, t1 - t0)
        return Verdict("verified", f"sound ({mode} check)", seconds={"check": t1 - t0})
    reason = "; ".join(problems[:3]) + (f" (+{len(problems) - 3} more)" if len(problems) > 3 else "")
    records, info = salvage_records(os.path.join(path, "data.mdb"))  # under "reset" too: what it claimed, for the log
    t2 = time.perf_counter()
    claimed = int(info.get("claimed", 0))
    if on_damage == "refuse":
        raise Damaged(reason, problems[:20], records, claimed)
    if on_damage == "reset":
        records = []
    moved = os.path.join(path, f"data.mdb.damaged-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}")
    try:
        rebuild_index(path, records, map_size, moved)
    except Exception as e:
        if isinstance(e, OSError):
            raise
        raise OSError(f"L3 index {path} is damaged ({reason}) and its repair could not be written: "
                      f"{type(e).__name__}: {e}") from e
    t3 = time.perf_counter()
    v = Verdict("salvaged" if on_damage == "salvage" else "reset", reason, problems[:20], kept=len(records),
                claimed=claimed, moved_to=moved, seconds={"check": t1 - t0, "salvage": t2 - t1, "rebuild": t3 - t2})
    if log is not None:
        log.error("L3 index %s was damaged (%s): moved to %s; the new index keeps %d of the %d entries the damaged "
                  "file claimed (%s; the rest are misses, never wrong bytes)", path, reason, moved, v.kept, claimed,
                  "what the check could prove" if on_damage == "salvage" else "index.on_damage = reset")
    return v
