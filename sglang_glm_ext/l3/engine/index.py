"""The shared L3 index: one embedded LMDB environment per node, opened by every rank at once.

A key is 57 bytes (deployment tag | namespace digest | payload kind | content hash), a value 16 (owner rank | disk
| slot | last access): ``index_entry.py`` is the codec, and the only module that knows the key's byte layout; its
names are re-exported here, where callers import them from.

Invariants:
* An entry is written only after its payload is durable (the store's writer calls :meth:`commit_puts` after
  fdatasync); an entry therefore never points at bytes that a crash can lose.
* Deletes that reclaim a slot are conditional (:meth:`delete_if`): they remove the entry only if it still names
  the same (rank, disk, slot), so one rank never deletes an entry another rank has since written.
* A write transaction that cannot commit -- a full map (``lmdb.MapFullError``), or the file system refusing the
  commit (a full disk: ``mdb_txn_commit: Input/output error`` / ``No space left on device``, any ``lmdb.Error``) --
  is aborted by LMDB and reported as ``False`` / ``None``, counted (``index_full`` / ``write_errors``), with the
  reason in :attr:`L3Index.last_refusal`; it never propagates to the data path. A read after such a refusal still
  works (LMDB marks the environment unusable only when its meta page write fails: then reads fail too, and the
  store treats the outcome as unknown).

LMDB's own lock file makes the environment safe for several processes (``lock=True``); write transactions are
serialised across processes by it.

No bytes in ``data.mdb`` may crash a process: LMDB trusts every page number and offset in the file
it maps, so a process's first open of an index runs inside :func:`index_check.guarded`, which proves the file sound
with bounded preads before anything maps it, and moves a damaged file aside for a new index of what it can prove
(``index.check``, ``index.on_damage``; index_check.py says how).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Iterable, Iterator, NamedTuple, Sequence

import lmdb

from ..disk.fsutil import fsync_dir, make_private_dirs
from . import index_check
from .index_entry import (KEY_LEN, VALUE_LEN, IndexEntry, IndexKey, KeySpace, deployment_tag, make_key,
                          namespace_and_kind, now_us, split_key)

log = logging.getLogger(__name__)

__all__ = ["IndexEntry", "IndexKey", "KeySpace", "L3Index", "IndexDamagedError", "ScanResult", "Refusal", "deployment_tag",
           "make_key", "split_key", "namespace_and_kind", "now_us", "KEY_LEN", "VALUE_LEN"]

_DB_NAME = b"pages"


class IndexDamagedError(OSError):
    """The index file is damaged and this open may not repair it (``on_damage = "refuse"``: fsck without
    ``--repair``, a read-only open), or a file cut short since the first open of the node checked it.

    Raised at open, before any page of the file is touched through the map: LMDB maps ``data.mdb``, and a read of a
    page past the end of a truncated file is SIGBUS, which no caller can catch. ``findings`` is the check's
    :class:`index_check.Damaged` (its problems, and what a salvage would keep) where the check ran."""

    def __init__(self, message: str, findings: "index_check.Damaged | None" = None):
        super().__init__(message)
        self.findings = findings


_REMEDY = ("stop every server on this node and start one (or run `sglang-glm-ext l3 fsck --repair`): the first "
           "opener moves the damaged file aside and keeps every entry it can prove (the rest are misses, never wrong "
           "bytes)")


def _check_data_file(env: lmdb.Environment, path: str) -> None:
    """Refuse a ``data.mdb`` shorter than the pages its newest meta page says are committed.

    The guard proved the file at the node's first open; this covers a file cut since, while processes had it open.
    LMDB's open reads the two meta pages with pread (a file too short for them is MDB_INVALID, an lmdb.Error);
    ``env.info()`` / ``env.stat()`` read only those meta pages. Every page a reader can reach is numbered at most
    ``last_pgno`` (LMDB never shrinks the file; a writer writes pages before the meta that names them), so a
    file of at least ``(last_pgno + 1) * psize`` bytes cannot fault on any read this process will make.
    """
    data = os.path.join(path, "data.mdb")
    info = env.info()
    psize = env.stat()["psize"]
    need = (int(info["last_pgno"]) + 1) * int(psize)
    try:
        size = os.stat(data).st_size
    except OSError as e:
        raise IndexDamagedError(f"L3 index {data}: cannot stat the data file: {e}") from e
    if size < need:
        raise IndexDamagedError(
            f"L3 index {data} is {size} B but its last committed page (number {info['last_pgno']}, {psize} B "
            f"pages) ends at byte {need}: the file is truncated or damaged, and reading it would crash the "
            f"process. It was cut while processes had it open, so it is not replaced under them: {_REMEDY}.")


def _lmdb_open(path: str, map_size: int, readonly: bool, max_readers: int) -> lmdb.Environment:
    try:
        return lmdb.open(
            path, map_size=map_size, subdir=True, readonly=readonly, lock=True, max_dbs=4,
            max_readers=max_readers, mode=0o600, readahead=False, meminit=False,
            # sync + metasync: a committed entry survives power loss (given the disk honours flushes / PLP).
            sync=True, metasync=True, create=not readonly,
        )
    except lmdb.Error as e:
        raise OSError(f"L3 index: cannot open LMDB environment at {path!r}: {e}") from e


# TEST-ONLY: open without the guard (the open before the guard existed), so the bit-rot tests and the bench can show
# that the flips they make do break an unguarded open (their negative control) and time it as "today". Nothing else
# may set it: an unguarded open maps a file nobody proved, and a flipped byte in it can kill the process.
_UNGUARDED_FOR_TESTS = False


class Refusal(NamedTuple):
    """Why the last write transaction of an index handle did not commit (diagnostics: the counters are the record)."""

    full: bool  # the LMDB map is full (enlarge index.map_size); else the file system refused (a full disk, EIO)
    message: str

    def __str__(self) -> str:
        return self.message


def _refusal(e: BaseException) -> Refusal:
    return Refusal(isinstance(e, lmdb.MapFullError), f"{type(e).__name__}: {e}")


class ScanResult(NamedTuple):
    items: list  # [(key, IndexEntry)] of the range, in page order
    damaged: int  # keys found out of sorted order (a damaged page); 0 for a healthy index
    malformed: int  # records of the range whose value is not an entry (skipped)
    full_walk: bool  # the range walk met damage, so the whole database was walked instead


def _successor(prefix: bytes) -> "bytes | None":
    """The smallest key greater than every key that starts with ``prefix`` (None: no such key)."""
    p = bytearray(prefix)
    while p:
        if p[-1] < 0xFF:
            p[-1] += 1
            return bytes(p)
        p.pop()
    return None


def _walk_range(txn, prefix: bytes) -> "list[tuple[bytes, bytes]] | None":
    """Records of the range from a positioned walk, or None when the walk sees any sign of a damaged page."""
    look = txn.cursor()
    back: list[bytes] = []
    positioned = look.set_range(prefix)
    if positioned or look.last():
        if not positioned:
            back.append(look.key())
        while len(back) < 2 and look.prev():
            back.append(look.key())
    # back[0] is the key just before the walk's start, back[1] the one before it: both below the range, in order.
    if back and back[0] >= prefix:
        return None
    if len(back) == 2 and not back[1] < back[0]:
        return None
    hi = _successor(prefix)
    cur = txn.cursor()
    out: list[tuple[bytes, bytes]] = []
    prev = back[0] if back else None
    if not cur.set_range(prefix):
        return out
    records = cur.iternext(keys=True, values=True)  # (key, value) pairs from the cursor on, made in C
    for rec in records:
        k = rec[0]
        if prev is not None and k <= prev:
            return None
        if k.startswith(prefix):
            out.append(rec)
            prev = k
            continue
        # The first key past the range (k > prev, so k >= hi): the range really ends here only if the order
        # goes on after it; a damaged key that sorts high would be followed by a smaller (in-range) key.
        if hi is not None and k < hi:
            return None
        after = next(records, None)
        if after is not None and not after[0] > k:
            return None
        return out
    return out


# LMDB allows one Environment per file per process (a second open of the same path is an error, and closing
# either would break the other). Several stores in one process (tests, tools, several ranks in one process)
# therefore share one Environment per path, reference-counted.
_ENVS: dict[str, list] = {}
_ENVS_LOCK = threading.Lock()


class L3Index:
    """LMDB environment + one named database. Thread-safe: read txns per call, write txns serialised by LMDB."""

    def __init__(self, env: lmdb.Environment, path: str, map_size: int, readonly: bool,
                 verdict: "index_check.Verdict | None" = None):
        self.env = env
        self.path = path
        self.map_size = map_size
        self.readonly = readonly
        self.db = env.open_db(_DB_NAME, create=not readonly)
        self.index_full = 0  # puts refused because the map is full (monotonic)
        self.write_errors = 0  # write transactions the file system refused (a full disk, EIO; monotonic)
        self.last_refusal: Refusal | None = None  # why the last refused write transaction did not commit
        self.damage_seen = 0  # scans that found keys out of order or malformed values (monotonic)
        self.stale_readers_cleared = 0  # reader slots of dead processes this handle cleared (monotonic)
        # What the guard found and did at this process's first open of the path (shared by every handle of it;
        # None only for a test's unguarded open).
        self.verdict = verdict

    @classmethod
    def open(cls, path: str, map_size: int, *, readonly: bool = False, max_readers: int = 1024,
             check: str = "fast", on_damage: str = "salvage") -> "L3Index":
        """Open the index environment at ``path``: missing directories are created 0700, the files LMDB creates are
        0600 (LMDB's ``mode``); nothing that exists is re-permissioned. Errors are loud (OSError /
        lmdb.Error with the path): they happen at store open, never on the data path.

        This process's first open of ``path`` runs inside :func:`index_check.guarded`: the node's first opener proves
        the file with ``check`` ("fast" | "full") before LMDB maps it, and a damaged file is moved aside and
        replaced (``on_damage``: "salvage" keeps what can be proven, "reset" nothing; "refuse", and every read-only
        open, changes nothing and raises :class:`IndexDamagedError` with the findings). Later opens in the process
        share its environment (LMDB allows one per file per process) and its verdict."""
        path = os.path.abspath(path)
        with _ENVS_LOCK:
            shared = _ENVS.get(path)
            if shared is not None:
                _check_data_file(shared[0], path)  # cheap (one stat): a file cut since the first open is refused too
                shared[1] += 1
                ix = cls(shared[0], path, map_size, readonly, shared[2])
                ix.reader_check()
                return ix
            if not readonly:
                # Missing directories owner-only; an existing index.path keeps the mode its operator gave it.
                make_private_dirs(path)
            verdict = None
            if _UNGUARDED_FOR_TESTS:
                env = _lmdb_open(path, map_size, readonly, max_readers)
            else:
                try:
                    with index_check.guarded(path, check=check, on_damage="refuse" if readonly else on_damage,
                                             map_size=map_size, log=log) as verdict:
                        env = _lmdb_open(path, map_size, readonly, max_readers)
                except index_check.Damaged as e:
                    raise IndexDamagedError(
                        f"L3 index {os.path.join(path, 'data.mdb')} is damaged ({e.reason}); it was left as it is "
                        f"(a salvage would keep {len(e.records)} of the {e.claimed} entries it claims). To repair "
                        f"it, {_REMEDY}.", e) from None
            try:
                _check_data_file(env, path)
                if not readonly:
                    fsync_dir(path)  # data.mdb / lock.mdb may have just been created: make their names durable
            except BaseException:
                env.close()
                raise
            _ENVS[path] = [env, 1, verdict]
            ix = cls(env, path, map_size, readonly, verdict)
        ix.reader_check()
        return ix

    # ------------------------------------------------------------------ reads
    def get(self, key: bytes) -> IndexEntry | None:
        if len(key) != KEY_LEN:
            return None
        with self.env.begin(db=self.db, buffers=False) as txn:
            return IndexEntry.decode(txn.get(key))

    def get_many(self, keys: Sequence[bytes | None]) -> list[IndexEntry | None]:
        """One read transaction for the whole batch (one consistent snapshot). A key that is not a well-formed
        57-byte key (None, empty, wrong length) and a damaged value are each a None of their own."""
        out: list[IndexEntry | None] = []
        with self.env.begin(db=self.db, buffers=False) as txn:
            get = txn.get
            for k in keys:
                out.append(IndexEntry.decode(get(k)) if k is not None and len(k) == KEY_LEN else None)
        return out

    def prefix_len(self, keys: Iterable[bytes]) -> int:
        """Length of the contiguous run of present keys from the start (stops at the first miss; a malformed key
        or a damaged value is a miss)."""
        n = 0
        with self.env.begin(db=self.db, buffers=True) as txn:
            get = txn.get
            for k in keys:
                if k is None or len(k) != KEY_LEN:
                    break
                v = get(k)
                if v is None or len(v) != VALUE_LEN:
                    break
                n += 1
        return n

    def scan(self, prefix: bytes) -> "ScanResult":
        """Every (key, entry) whose key starts with ``prefix``, in one read txn, even in a damaged index.

        Invariant: a damaged key (a flipped byte in a leaf page puts a key out of sorted order, possibly outside
        the range, in the middle of the range's records) never ends the scan early nor hides a record. The fast
        path walks from ``set_range(prefix)`` and checks that the keys it passes are strictly increasing, that the
        two keys before its start are below the range and in order (a damaged key can mislead the binary search
        that positions it), and that the range ends at a key followed by a larger one. Any break is damage: the
        whole database is then walked in page order -- a cursor walk follows page links and compares no keys,
        so it sees every record -- and the range's records are picked from it (``full_walk``). With at most
        one damaged key near the range the fast path either sees it or cannot have missed anything; the full walk
        covers any amount of damage in leaf keys.
        """
        with self.env.begin(db=self.db, buffers=False) as txn:
            raw = _walk_range(txn, prefix)
            full = raw is None
            damaged = 0
            if full:
                raw, prev = [], None
                for k, v in txn.cursor():
                    if prev is not None and k <= prev:
                        damaged += 1
                    prev = k
                    if k.startswith(prefix):
                        raw.append((k, v))
                damaged = max(damaged, 1)
        items, malformed = [], 0
        for k, v in raw:
            e = IndexEntry.decode(v)
            if e is None:
                malformed += 1
            else:
                items.append((k, e))
        if damaged or malformed:
            self.damage_seen += 1
            log.warning("L3 index %s: range %s has %d key(s) out of order and %d malformed value(s) (a page damaged "
                        "since this node's first open checked the file); scanned by a full walk. To repair it, stop "
                        "the node's servers and start one, or run fsck --repair.",
                        self.path, prefix[:8].hex(), damaged, malformed)
        return ScanResult(items, damaged, malformed, full)

    def iter_prefix(self, prefix: bytes) -> Iterator[tuple[bytes, IndexEntry]]:
        """All (key, entry) whose key starts with ``prefix`` (see :meth:`scan`); materialised in one read txn."""
        return iter(self.scan(prefix).items)

    def iter_rank(self, dep_tag: bytes, rank: int, ns_digest: bytes | None = None) -> Iterator[tuple[bytes, IndexEntry]]:
        """Entries of this deployment (and namespace, if given) owned by ``rank`` (cold start, clear, fsck)."""
        prefix = dep_tag + (ns_digest or b"")
        return ((k, e) for k, e in self.iter_prefix(prefix) if e.rank == rank)

    def count(self) -> int:
        with self.env.begin(db=self.db) as txn:
            return txn.stat(self.db)["entries"]

    def stat(self) -> dict:
        """LMDB B-tree stats plus bytes used by the data file (for sizing)."""
        with self.env.begin(db=self.db) as txn:
            s = dict(txn.stat(self.db))
        s["bytes_used"] = (s["branch_pages"] + s["leaf_pages"] + s["overflow_pages"]) * s["psize"]
        return s

    # ------------------------------------------------------------------ writes
    def put(self, key: bytes, entry: IndexEntry) -> bool:
        """Unconditional put. False (and ``index_full`` += 1) when the map is full."""
        try:
            with self.env.begin(db=self.db, write=True) as txn:
                txn.put(key, entry.pack())
            return True
        except lmdb.Error as e:
            self._refused(e, items=1)
            return False

    def commit_puts(self, items: Sequence[tuple[bytes, IndexEntry]]) -> list[IndexEntry | None] | None:
        """Insert-if-absent for a batch in ONE transaction (one commit = one sync for the whole batch).

        Returns, per item, ``None`` when this item's entry was written, or the existing entry that won (another
        rank or an earlier spill stored the same page first: the caller frees its own slot). Returns ``None``
        overall when the transaction did not commit: the map is full, or the file system refused the commit
        (:attr:`last_refusal` says which); LMDB aborted it, so nothing of the batch is present.
        """
        def txn_body():
            out: list[IndexEntry | None] = []
            with self.env.begin(db=self.db, write=True) as txn:
                for key, entry in items:
                    packed = entry.pack()
                    if txn.put(key, packed, overwrite=False):
                        out.append(None)
                        continue
                    cur = IndexEntry.decode(txn.get(key))
                    if cur is None:  # a damaged value is no entry: ours replaces it
                        txn.put(key, packed)
                    out.append(cur)
            return out

        try:
            return self._retry_after_reader_check(txn_body)
        except lmdb.Error as e:
            self._refused(e, items=len(items))
            return None

    def _refused(self, e: BaseException, items: int = 0) -> None:
        """Count a write transaction LMDB aborted: a full map per put refused (``items``; a refused delete or touch
        is counted by its caller), anything else once."""
        self.last_refusal = _refusal(e)
        if self.last_refusal.full:
            self.index_full += items
        else:
            self.write_errors += 1

    def _retry_after_reader_check(self, txn_body):
        """Run a write transaction; on a full map, clear dead processes' reader slots and, if any were cleared
        (their pinned snapshots kept pages from being reused), try once more. MapFullError propagates."""
        try:
            return txn_body()
        except lmdb.MapFullError:
            if not self.reader_check():
                raise
        return txn_body()

    def reader_check(self) -> int:
        """Clear reader-table slots left by processes that no longer exist (LMDB's ``mdb_reader_check``).

        A SIGKILLed rank leaves its slot, and LMDB resets its reader table only when no process has the
        environment open -- never while other ranks run. A stale slot pins the snapshot it was reading (no page
        that snapshot can see is reused, so the file grows towards map full) and holds one of ``max_readers``.
        Called at every open, periodically by each store's writer, and before a full map is reported.
        Returns the slots cleared."""
        try:
            n = int(self.env.reader_check())
        except lmdb.Error:
            return 0
        if n:
            self.stale_readers_cleared += n
            log.warning("L3 index %s: cleared %d reader slot(s) of dead processes", self.path, n)
        return n

    def delete(self, key: bytes) -> bool:
        try:
            with self.env.begin(db=self.db, write=True) as txn:
                return txn.delete(key)
        except lmdb.Error as e:
            self._refused(e)
            return False

    def delete_scanned(self, items: Sequence[tuple[bytes, IndexEntry]], *, damaged: bool, exact: bool = False
                       ) -> int | None:
        """Conditionally delete entries that a :meth:`scan` returned (same location; with ``exact`` the same
        entry, see :meth:`delete_if`). After a scan that found damage, by position (a key search may not find
        them); else like :meth:`delete_if`, chunked. Returns the count deleted, or None when the map is full."""
        try:
            if damaged:
                return self._delete_by_walk(dict(items), exact=exact)
            n = 0
            for i in range(0, len(items), 4096):
                res = self.delete_if(items[i:i + 4096], exact=exact)
                if res is None:
                    return None
                n += sum(1 for r in res if r is True)
            return n
        except lmdb.Error as e:
            self._refused(e)
            return None

    def delete_if(self, items: Sequence[tuple[bytes, IndexEntry]], *, newer_than_wins: bool = False,
                  exact: bool = False) -> list[bool | IndexEntry] | None:
        """Conditional delete in one transaction: remove ``key`` only if its entry still names the same location.

        With ``newer_than_wins`` an entry whose stored last_access is newer than the given one is kept and returned
        (another rank touched it; the GC re-queues it instead of reclaiming). With ``exact`` the whole entry must
        match, last_access included: a caller that saw the entry some time ago (a reader's verify failure, fsck)
        deletes only that very commit, never a newer commit of the same page into the same slot (which has a
        later last_access). Returns per item True (deleted), False (absent, points elsewhere, or another
        version) or the newer entry; ``None`` if LMDB could not commit (map full).
        """
        def txn_body():
            out: list[bool | IndexEntry] = []
            with self.env.begin(db=self.db, write=True) as txn:
                for key, expect in items:
                    cur = IndexEntry.decode(txn.get(key))
                    if cur is None or not cur.same_location(expect) or (exact and cur != expect):
                        out.append(False)
                    elif newer_than_wins and cur.last_access > expect.last_access:
                        out.append(cur)
                    else:
                        txn.delete(key)
                        out.append(True)
            return out

        try:
            return self._retry_after_reader_check(txn_body)
        except lmdb.Error as e:
            self._refused(e)
            return None

    def touch_many(self, items: Sequence[tuple[bytes, int]]) -> bool:
        """Raise last_access to ``ts`` (max, never lower) for keys that still exist. One transaction."""
        try:
            with self.env.begin(db=self.db, write=True) as txn:
                for key, ts in items:
                    cur = IndexEntry.decode(txn.get(key))
                    if cur is None:
                        continue
                    if ts > cur.last_access:
                        txn.put(key, cur._replace(last_access=ts).pack())
            return True
        except lmdb.Error as e:
            self._refused(e)
            return False

    def delete_for(self, dep_tag: bytes, rank: int, ns_digest: bytes | None = None, *,
                   keep_ns: bytes | None = None) -> int:
        """Delete entries of this deployment owned by ``rank`` (optionally only one namespace, or all namespaces
        but ``keep_ns``). Entries of other deployments and other ranks are never touched. Returns the count."""
        prefix = dep_tag + (ns_digest or b"")
        scan = self.scan(prefix)
        batch = [(k, e) for k, e in scan.items
                 if e.rank == rank and not (keep_ns is not None and namespace_and_kind(k)[0] == keep_ns)]
        if scan.damaged:
            # A search in a damaged page can miss keys that are there: delete by position instead.
            return self._delete_by_walk({k: None for k, _ in batch})
        n = 0
        # Chunked so one huge clear does not need one huge dirty-page set in a single transaction.
        for i in range(0, len(batch), 4096):
            with self.env.begin(db=self.db, write=True) as txn:
                for k, _ in batch[i:i + 4096]:
                    if txn.delete(k):
                        n += 1
        return n

    def _delete_by_walk(self, want: "dict[bytes, IndexEntry | None]", exact: bool = False) -> int:
        """Delete the records whose key is in ``want`` (and, where ``want[key]`` is an entry, whose value still
        names its location) by walking the whole database in page order in ONE write transaction: no key search,
        so a damaged page cannot hide a record. Used only when a scan found damage. Returns records deleted."""
        if not want:
            return 0
        n = 0
        with self.env.begin(db=self.db, write=True, buffers=False) as txn:
            cur = txn.cursor()
            ok = cur.first()
            while ok:
                k = cur.key()
                if k in want:
                    expect = want[k]
                    cur_e = IndexEntry.decode(cur.value())
                    if expect is None or (cur_e is not None and cur_e.same_location(expect)
                                          and (not exact or cur_e == expect)):
                        cur.delete()  # moves to the next record; an empty key means past the end
                        n += 1
                        ok = bool(cur.key())
                        continue
                ok = cur.next()
        return n

    def close(self) -> None:
        """Drop this handle; the Environment closes with its last handle in the process. Idempotent."""
        if self.env is None:
            return
        with _ENVS_LOCK:
            shared = _ENVS.get(self.path)
            if shared is not None and shared[0] is self.env:
                shared[1] -= 1
                if shared[1] == 0:
                    del _ENVS[self.path]
                    try:
                        self.env.close()
                    except Exception:
                        pass
        self.env = None
