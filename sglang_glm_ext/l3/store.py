"""L3Store: the durable disk tier for one rank: spill, exists, reload, free, clear, GC, cold start.

Threads and ownership (plan once, run without decisions):

* Caller threads (the scheduler / HiCache I/O threads) call ``spill*``, ``exists``, ``reload*``, ``free``,
  ``clear``, ``flush``, ``stats``. ``spill`` only copies into a staging buffer and queues; it never touches a slot
  pool and never blocks on the disk.
* ONE writer thread owns every slot pool and the GC LRU (no lock on either). It seals blobs (header + xxh3),
  hands O_DIRECT writes to a small I/O pool, fdatasyncs once per batch, then commits the index entries in one
  LMDB transaction. It also runs GC, frees, clears and reload touches, all received through queues.
* Reload runs on the caller's thread (plus a small read pool for batches); it only reads the index and the slabs.

Invariants (the crash-safety argument is in docs_internal/l3_design.md):

1. A page is present (``exists`` counts it, ``reload`` may return it) only once its index entry is committed,
   and an entry is committed only after the payload's fdatasync returned (and the slab's name is durable).
2. Reclaim (GC, free, verify failure) deletes the index entry, commits, and only then frees the slot: a reader
   that looked the entry up earlier reads either the old blob or a newer one whose header names a different
   page (verify -> miss). It never gets another page's bytes. A verify-failure reclaim deletes only the exact
   entry the reader saw, never a newer commit of the same page into the same slot.
3. Every slot an index entry of this rank references is allocated in its pool: after a ``load`` cold start and
   after a runtime ``clear`` (also one the index could only do in part); the pool only hands out free slots.
4. Data-path calls never raise: a failure is a miss plus a counter, and one bad element (key, destination,
   index value) costs only its own page. Bad configuration raises at ``open``.
5. A blob is checked against the page asked for AND this deployment (``Namespace.digest_for``); reload returns
   True only when the verified bytes are in the caller's own buffer (C-contiguous, writable, large enough).
6. One live store per (index, deployment, rank), on the node and in the process (``OwnerLock``).
"""

from __future__ import annotations

import collections
import errno
import heapq
import json
import logging
import os
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from .. import envs
from .aligned import AlignedBuffer, is_aligned
from .config import L3Config, L3ConfigError
from .fsutil import fsync_dir, make_private_dirs
from .format import (
    FORMAT_VERSION,
    HEADER_SIZE,
    Namespace,
    PayloadKind,
    key_to_bytes,
    parse_header,
    seal_blob,
    slot_bytes_for,
    verify_blob_reason,
)
from .index import IndexEntry, L3Index, OwnerLock, OwnerLockHeld, deployment_tag, make_key, now_us
from .slot_pool import SlotPool

log = logging.getLogger(__name__)

__all__ = ["L3Store", "L3StoreError", "L3OwnerLockedError", "ReadOnlySlab", "slab_path", "read_slab_meta"]

_TOUCH_PERSIST_INTERVAL_S = 1.0  # reload touches reach the shared index at most this often (coalesced)
_MAX_BATCH_WAIT_S = 0.002  # writer waits this long for a batch to fill before writing what it has
_READER_CHECK_INTERVAL_S = 30.0  # the writer clears dead processes' LMDB reader slots at most this often
_HEAP_SLACK = 64  # GC heap items allowed beyond 2x the live pages before a compaction


class L3StoreError(RuntimeError):
    """Open-time failure (bad path, locked slab, PLP refused, budget too small). Never raised on the data path."""


class L3OwnerLockedError(L3StoreError):
    """Another live store owns this (deployment, rank) on this index: in another process, or in this one
    (``in_this_process``; then :meth:`L3Store.find_open` returns it, for callers that share one store per
    (config, rank) per process). ``holder`` is what the owner recorded (pid, host, slab_dir) or None."""

    def __init__(self, msg: str, *, holder: "dict | None", in_this_process: bool):
        super().__init__(msg)
        self.holder = holder
        self.in_this_process = in_this_process


def slab_path(config: L3Config, rank: int, kind: PayloadKind, disk: int | None = None) -> str:
    return os.path.join(config.slab_dir(rank, disk), f"{kind.label}.slab")


def read_slab_meta(path: str) -> dict | None:
    """The JSON sidecar (``<slab>.meta.json``) the owner writes at open: slot size and count for readers / fsck."""
    try:
        with open(path + ".meta.json", "r") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _page_view(obj, *, writable: bool) -> np.ndarray:
    """A flat uint8 array over ``obj``'s OWN memory, in memory order; ValueError/TypeError for anything else.

    A page is a buffer's bytes in memory order. Only a C-contiguous buffer has its memory order equal to its
    logical order, so only such a buffer qualifies, on spill and on reload alike: for a Fortran-ordered or strided
    array numpy's ``reshape(-1)`` returns a copy, and a reload written into that copy would be acknowledged while
    the caller's array stays untouched (issue 7, item 1).
    """
    if isinstance(obj, AlignedBuffer):
        obj = obj.view
    if isinstance(obj, np.ndarray):
        if not obj.flags.c_contiguous:
            raise ValueError("array is not C-contiguous (Fortran order or a strided slice)")
        if writable and not obj.flags.writeable:
            raise ValueError("array is read-only")
        flat = obj.reshape(-1).view(np.uint8)
    else:
        mv = memoryview(obj)
        if not mv.c_contiguous:
            raise ValueError("buffer is not C-contiguous")
        if writable and mv.readonly:
            raise ValueError("buffer is read-only")
        flat = np.frombuffer(mv, dtype=np.uint8) if mv.ndim == 1 and mv.format == "B" else \
            np.frombuffer(mv.cast("B"), dtype=np.uint8)
    if writable and not flat.flags.writeable:
        raise ValueError("buffer is read-only")
    return flat


def _per_page(seq, n: int) -> list:
    """``seq`` as a list of exactly ``n`` items, None-padded (a short or missing list costs only its missing pages)."""
    try:
        items = list(seq) if seq is not None else []
    except TypeError:
        items = []
    return (items + [None] * n)[:n]


def _check_slab_owner(path: str, deployment_id: str, rank: int) -> None:
    """Refuse a slab whose sidecar names another deployment or rank: its directory resolves to someone else's
    (a symlink or bind mount). The digest check would keep the bytes apart anyway; this makes the set-up loud."""
    meta = read_slab_meta(path)
    if not isinstance(meta, dict):
        return
    owner, owner_rank = meta.get("deployment_id"), meta.get("rank")
    if (owner is not None and owner != deployment_id) or (owner_rank is not None and owner_rank != rank):
        raise L3StoreError(
            f"L3 slab {path} belongs to deployment {owner!r} rank {owner_rank} (its sidecar says so), not to "
            f"deployment {deployment_id!r} rank {rank}: two deployments' directories resolve to the same files "
            f"(a symlink or bind mount?). Give each deployment a directory of its own.")


def _write_meta(path: str, meta: dict) -> None:
    tmp = path + ".meta.json.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(meta, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path + ".meta.json")
    fsync_dir(os.path.dirname(path))  # the rename, and a slab file created just before, are durable now


class ReadOnlySlab:
    """Read-only, lock-free view of a slab file (another rank's, or our own for parallel reads).

    The writer's exclusive flock stays with the owning ``DiskSlab``; readers never take it, so every rank can read
    every other rank's blobs while they run. O_DIRECT when the file system allows it, buffered otherwise.
    Thread-safe: positional reads only. Invariant: no descriptor a reader thread may be using is closed before
    :meth:`close`. The O_DIRECT fallback therefore opens a second, buffered descriptor and switches new reads to
    it; the O_DIRECT one stays open (a read in flight on it finishes on the right file) until close. Closing and
    reopening instead would free the number for any concurrent ``open`` in the process, and a read in flight
    would then read that other file.
    """

    def __init__(self, path: str, slot_bytes: int):
        self.path = path
        self.slot_bytes = slot_bytes
        self._lock = threading.Lock()
        self._spare: list[int] = []  # descriptors no longer handed to new reads, still open until close()
        flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
        try:
            self._fd = os.open(path, flags | os.O_DIRECT)
            self.direct = True
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            self._fd = os.open(path, flags)
            self.direct = False

    @property
    def fd(self) -> int:
        return self._fd

    def read_slot_into(self, slot: int, dst: AlignedBuffer, nbytes: int) -> int:
        """Read ``nbytes`` (a BLOCK multiple) of ``slot`` into the aligned ``dst``. Returns bytes read."""
        mv = dst.view[:nbytes]
        fd, direct = self._fd, self.direct
        try:
            return os.preadv(fd, [mv], slot * self.slot_bytes)
        except OSError as e:
            # Some file systems accept O_DIRECT at open but refuse the transfer: fall back once, for good.
            if not (direct and e.errno == errno.EINVAL):
                raise
        return os.preadv(self._buffered_fd(), [mv], slot * self.slot_bytes)

    def _buffered_fd(self) -> int:
        with self._lock:
            if self.direct:
                buffered = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                self._spare.append(self._fd)
                self._fd = buffered
                self.direct = False
            return self._fd

    def close(self) -> None:
        with self._lock:
            fds = [fd for fd in [self._fd, *self._spare] if fd >= 0]
            self._fd, self._spare = -1, []
        for fd in fds:
            os.close(fd)


@dataclass
class _Staged:
    seq: int
    kind: PayloadKind
    chash: bytes
    ikey: bytes
    buf: AlignedBuffer
    cancelled: bool = False


class _Signal(threading.Event):
    """Completion of one control operation, with its outcome."""

    ok = False


@dataclass(frozen=True)
class _Failure:
    """What a failed write / sync / commit was, as plain data.

    Never an exception object: an exception keeps its traceback, whose frames hold slices of the staging buffer
    (the ``data`` pwrite was given), so the buffer stays exported -- unmappable -- for as long as the exception
    is referenced (a future, a result list, a log record kept by a handler). That made the staging pool's
    next unmap of it fail with BufferError and drop later spills (issue 7, item 7)."""

    errno: int | None
    message: str

    def __str__(self) -> str:
        return self.message


def _failure(e: BaseException) -> _Failure:
    return _Failure(getattr(e, "errno", None), f"{type(e).__name__}: {e}")


def _write_slot(slab, slot: int, buf: AlignedBuffer) -> "_Failure | None":
    """I/O-pool task: write one sealed slot. Returns None, or the failure as plain data (see :class:`_Failure`);
    the exception and its traceback die with this frame."""
    try:
        slab.write_slot(slot, buf)
        return None
    except Exception as e:
        return _failure(e)


class _StagingPool:
    """Aligned slot-sized buffers, capped in total bytes. ``acquire`` never blocks: None means "full, drop"."""

    def __init__(self, cap_bytes: int, sizes: Mapping[PayloadKind, int]):
        self.cap = cap_bytes
        self.sizes = dict(sizes)
        self._free: dict[PayloadKind, list[AlignedBuffer]] = {k: [] for k in sizes}
        self._lock = threading.Lock()
        self.allocated = 0  # bytes of buffers that exist (in use or free); never exceeds cap
        self.in_use = 0
        self.peak_allocated = 0

    def acquire(self, kind: PayloadKind) -> AlignedBuffer | None:
        size = self.sizes[kind]
        with self._lock:
            lst = self._free[kind]
            if lst:
                self.in_use += size
                return lst.pop()
            if self.allocated + size > self.cap:
                # Give back idle buffers of other kinds before refusing: the cap is on bytes, not per kind.
                # A buffer counts until it is really unmapped: one still exported somewhere (BufferError) stays
                # in its free list, reusable and counted, so ``allocated`` is always the bytes actually mapped.
                for k, other in self._free.items():
                    if k == kind:
                        continue
                    pinned = []
                    while other and self.allocated + size > self.cap:
                        b = other.pop()
                        try:
                            b.close()
                        except BufferError:
                            pinned.append(b)
                            continue
                        self.allocated -= self.sizes[k]
                    other.extend(pinned)
                if self.allocated + size > self.cap:
                    return None
            self.allocated += size
            self.in_use += size
            self.peak_allocated = max(self.peak_allocated, self.allocated)
        return AlignedBuffer(size)

    def release(self, kind: PayloadKind, buf: AlignedBuffer) -> None:
        with self._lock:
            self.in_use -= self.sizes[kind]
            self._free[kind].append(buf)

    def close(self) -> None:
        with self._lock:
            for lst in self._free.values():
                for b in lst:
                    try:
                        b.close()
                    except BufferError:
                        pass
                lst.clear()


@dataclass
class _Counters:
    spilled: int = 0          # pages made durable by this store
    spill_accepted: int = 0   # spill() calls that returned True for a page
    dedup: int = 0            # pages accepted without a write (already durable / staged / won by another rank)
    dropped_staging: int = 0  # staging bytes cap or max_inflight reached
    dropped_pool_full: int = 0
    dropped_bad_input: int = 0
    write_errors: int = 0
    index_full: int = 0
    reload_hits: int = 0
    reload_misses: int = 0
    reload_bad_dst: int = 0   # destinations that cannot take the page in place (too small, strided, read-only)
    verify_failures: int = 0
    gc_reclaimed: int = 0
    freed: int = 0
    data_path_errors: int = 0  # unexpected exceptions turned into misses


@dataclass
class _KindState:
    kind: PayloadKind
    page_bytes: int
    slot_bytes: int
    num_slots: int
    slab: Any  # disk.DiskSlab
    pool: SlotPool
    heap: list = field(default_factory=list)  # (last_access, seq, ikey, slot); lazy deletion against `current`
    current: dict = field(default_factory=dict)  # ikey -> (last_access, slot) for every entry this rank owns
    gc_active: bool = False


class L3Store:
    """One rank's view of the L3 tier. Build with :meth:`open`."""

    # ------------------------------------------------------------------ open
    @classmethod
    def open(cls, config: L3Config, *, rank: int, namespace: Namespace,
             page_bytes: Mapping[PayloadKind | str, int], cold_start: str | None = None) -> "L3Store":
        """Open this rank's slabs, check PLP, open the index, apply the cold-start policy, start the writer.

        Every failure here is loud (:class:`L3StoreError` / :class:`L3ConfigError`). ``cold_start`` overrides the
        config's mode (tests and tools).
        """
        return cls(config, rank=rank, namespace=namespace, page_bytes=page_bytes, cold_start=cold_start)

    def __init__(self, config: L3Config, *, rank: int, namespace: Namespace,
                 page_bytes: Mapping[PayloadKind | str, int], cold_start: str | None = None):
        if not isinstance(config, L3Config):
            raise L3ConfigError(f"<config>: expected L3Config, got {type(config).__name__}")
        config.check_rank(rank)
        if not isinstance(namespace, Namespace):
            raise L3ConfigError(f"namespace: expected format.Namespace, got {type(namespace).__name__}")
        # Precedence: the caller's override, then SGLANG_CP_L3_COLD_START (one launch), then the config file.
        mode = cold_start or envs.CP_L3_COLD_START.raw() or config.cold_start
        if mode not in ("clear", "load"):
            raise L3ConfigError(f"cold_start: unknown mode {mode!r} (expected 'clear' or 'load')")
        kinds: dict[PayloadKind, int] = {}
        for k, n in page_bytes.items():
            try:
                kind = PayloadKind.parse(k)
            except ValueError as e:
                raise L3ConfigError(f"page_bytes: {e}") from None
            if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
                raise L3ConfigError(f"page_bytes.{kind.label}: expected a positive int, got {n!r}")
            kinds[kind] = n
        if not kinds:
            raise L3ConfigError("page_bytes: at least one payload kind is required")

        self.config = config
        self.rank = rank
        self.namespace = namespace
        # Every blob is sealed with, and checked against, a digest of the namespace AND the deployment: a blob of
        # another deployment never verifies here even if the two ever share slab files.
        self.ns = namespace.digest_for(config.deployment_id)
        self.dep = deployment_tag(config.deployment_id)
        self.disk = config.disk_for_rank(rank)
        self.cold_start = mode
        self.c = _Counters()
        self._closed = False
        self._warned: set[str] = set()
        self._kinds: dict[PayloadKind, _KindState] = {}
        self._readers: dict[tuple[int, int, PayloadKind], ReadOnlySlab | None] = {}
        self._readers_lock = threading.Lock()
        self._tls = threading.local()
        self.index: L3Index | None = None
        self._owner: OwnerLock | None = None

        slot_bytes = {k: slot_bytes_for(n) for k, n in kinds.items()}
        nslots = config.slots_per_kind(rank, {k.label: b for k, b in slot_bytes.items()})
        sdir = config.slab_dir(rank)
        # One live owner per (deployment, rank) on an index, taken before anything is created or deleted for it.
        try:
            make_private_dirs(config.index_path)
            self._owner = OwnerLock.acquire(config.index_path, config.deployment_id, rank, owner=self,
                                            info={"slab_dir": sdir, "deployment_id": config.deployment_id,
                                                  "rank": rank})
        except OwnerLockHeld as e:
            raise L3OwnerLockedError(str(e), holder=e.holder, in_this_process=e.in_this_process) from None
        except OSError as e:
            raise L3StoreError(f"index.path: cannot take the owner lock for rank {rank} in "
                               f"{config.index_path!r}: {e}") from e
        try:
            self._open_owned(config, rank, kinds, slot_bytes, nslots, sdir, mode)
        except BaseException:
            self._close_files()
            raise

    @classmethod
    def find_open(cls, config: L3Config, rank: int) -> "L3Store | None":
        """The store this process has open for (config's index, deployment, rank), or None. A caller that must
        share one store per (config, rank) per process (the HiCache backend) looks here before :meth:`open`."""
        lock = OwnerLock.find(config.index_path, config.deployment_id, rank)
        store = lock.owner if lock is not None else None
        return store if isinstance(store, cls) and not store._closed else None

    def _open_owned(self, config: L3Config, rank: int, kinds, slot_bytes, nslots, sdir: str, mode: str) -> None:
        """The rest of open, run once this store owns (deployment, rank): slabs, PLP, index, cold start, threads."""
        from . import disk as _disk  # A's primitives; imported late so config/index stay usable without them

        try:
            # Missing directories owner-only; existing ones (the configured disk path, a pre-made deployment
            # directory) keep the mode their operator gave them.
            make_private_dirs(sdir)
            if not os.access(sdir, os.W_OK):
                raise PermissionError(errno.EACCES, "not writable", sdir)
        except OSError as e:
            raise L3StoreError(f"disks[{self.disk}].path: cannot create slab directory {sdir!r}: {e}") from e

        # Power-loss protection: decided once per disk, loud when require_plp and the disk is not known safe.
        try:
            self.plp = _disk.probe_plp(config.disks[self.disk].path, plp=config.plp)
            _disk.check_plp(self.plp, config.require_plp)
        except Exception as e:
            raise L3StoreError(f"disks[{self.disk}]: power-loss protection check failed: {e}") from e

        direct = {"auto": "auto", "on": True, "off": False}[config.direct_io]
        try:
            for kind, pb in kinds.items():
                path = slab_path(config, rank, kind)
                slab = _disk.DiskSlab.open(path, slot_bytes=slot_bytes[kind], num_slots=nslots[kind.label],
                                           create=True, direct=direct)
                self._kinds[kind] = _KindState(kind, pb, slot_bytes[kind], nslots[kind.label], slab,
                                               SlotPool(nslots[kind.label]))
                _check_slab_owner(path, config.deployment_id, rank)
                _write_meta(path, {
                    "format_version": FORMAT_VERSION, "kind": kind.label, "slot_bytes": slot_bytes[kind],
                    "num_slots": nslots[kind.label], "page_bytes": pb, "deployment_id": config.deployment_id,
                    "rank": rank, "disk": self.disk, "ns_digest": self.ns.hex(),
                })
            self.index = L3Index.open(config.index_path, config.index_map_size)
        except Exception as e:
            self._close_files()
            if isinstance(e, (L3StoreError, L3ConfigError)):
                raise
            raise L3StoreError(f"L3 store open failed for rank {rank}: {type(e).__name__}: {e}") from e

        # Cold start runs single-threaded, BEFORE the writer exists: the writer is the sole pool/GC owner after.
        try:
            self._apply_cold_start(mode)
        except Exception as e:
            self._close_files()
            raise L3StoreError(f"cold_start={mode}: failed for rank {rank}: {type(e).__name__}: {e}") from e

        self._staging = _StagingPool(config.staging_bytes, slot_bytes)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._queue: collections.deque[_Staged] = collections.deque()
        self._staged: dict[tuple[PayloadKind, bytes], _Staged] = {}
        self._ctl: collections.deque = collections.deque()
        self._enq_seq = 0
        self._done_seq = 0
        self._ctl_enq = 0
        self._ctl_done = 0
        self._stop = False
        self._touch_pending: dict[bytes, int] = {}
        # Reload outcomes for the writer, one slot per page (latest wins): (kind, ikey) -> (entry, ts) / entry.
        self._touch_in: dict[tuple[PayloadKind, bytes], tuple[IndexEntry, int]] = {}
        self._bad_in: dict[tuple[PayloadKind, bytes], IndexEntry] = {}
        self._touch_flushed_at = time.monotonic()
        self._reader_checked_at = time.monotonic()
        self._gc_seq = 0
        self._io = ThreadPoolExecutor(config.io_threads, thread_name_prefix=f"l3-io-r{rank}")
        self._reload_pool = ThreadPoolExecutor(config.reload_threads, thread_name_prefix=f"l3-rd-r{rank}")
        self._completed: collections.deque = collections.deque()
        self._commits_inflight = 0
        self._commit_q: queue.Queue = queue.Queue(maxsize=2)
        self._committer = threading.Thread(target=self._committer_main, name=f"l3-commit-r{rank}", daemon=True)
        self._committer.start()
        self._writer = threading.Thread(target=self._writer_main, name=f"l3-writer-r{rank}", daemon=True)
        self._writer.start()

    # ------------------------------------------------------------------ cold start
    def _apply_cold_start(self, mode: str) -> None:
        """``clear``: drop this deployment+rank's entries (all namespaces); pools start empty.
        ``load``: keep entries whose slot header still names the page; drop the rest; occupy kept slots.

        Either way, entries of this deployment+rank under ANOTHER namespace are dropped: the rank's slabs are
        reused by the current namespace, so such entries would point at slots this process will hand out.
        """
        idx = self.index
        if mode == "clear":
            idx.delete_for(self.dep, self.rank)  # every namespace; by position if the index is damaged
            for st in self._kinds.values():
                st.pool.reset()
            self.loaded_pages = 0
            self.stale_dropped = 0
            return
        idx.delete_for(self.dep, self.rank, keep_ns=self.ns)
        loaded = 0
        # scan, not a key search per entry: a damaged key must neither end the walk nor hide the entries after it
        scan = idx.scan(self.dep + self.ns)
        by_kind: dict[int, list[tuple[bytes, IndexEntry]]] = collections.defaultdict(list)
        for key, e in scan.items:
            if e.rank == self.rank:
                by_kind[key[24]].append((key, e))
        stale: list[tuple[bytes, IndexEntry]] = []
        for kv, items in by_kind.items():
            st = self._kinds.get(PayloadKind(kv)) if kv in PayloadKind._value2member_map_ else None
            if st is None:
                stale.extend(items)  # a kind this process does not serve: its slab is not ours to keep
                continue
            live_slots: list[int] = []
            seen: set[int] = set()
            for key, e in items:
                ok = False
                if e.disk == self.disk and 0 <= e.slot < st.num_slots and e.slot not in seen:
                    hdr = self._read_header(st, e.slot)
                    ok = (hdr is not None and hdr.kind == st.kind and hdr.content_hash == key[25:57]
                          and hdr.ns_digest == self.ns and hdr.payload_len == st.page_bytes)
                if ok:
                    seen.add(e.slot)
                    live_slots.append(e.slot)
                    st.current[key] = (e.last_access, e.slot)
                    st.heap.append((e.last_access, len(st.heap), key, e.slot))
                else:
                    stale.append((key, e))
            st.pool.rebuild_from_allocated(live_slots)
            heapq.heapify(st.heap)
            loaded += len(live_slots)
        # Stale entries point at slots this rank may now hand out: remove them before any write can happen.
        if stale and idx.delete_scanned(stale, damaged=bool(scan.damaged)) is None:
            raise L3StoreError("index map full while dropping stale entries; enlarge index.map_size")
        self.loaded_pages = loaded
        self.stale_dropped = len(stale)

    @staticmethod
    def _read_header(st: _KindState, slot: int):
        try:
            h = st.slab.read_header(slot)
        except Exception:
            return None
        if h is None or hasattr(h, "content_hash"):
            return h
        return parse_header(h)

    # ------------------------------------------------------------------ keys
    def _ikey(self, kind: PayloadKind, chash: bytes) -> bytes:
        return make_key(self.dep, self.ns, kind, chash)

    # ------------------------------------------------------------------ spill
    def spill(self, kind, keys: Sequence, pages: Sequence) -> list[bool]:
        """Copy each page into staging and queue it; return at once. Per page: True if accepted (durable soon,
        or already durable / staged: dedup), False if dropped (staging full, max inflight, bad input: counted).
        A page is a C-contiguous buffer of exactly page_bytes, taken in memory order; anything else is bad input.
        The caller may reuse or unpin its page buffers as soon as this returns."""
        return self._spill(kind, keys, pages, None, None)

    def spill_from_layout(self, kind, keys: Sequence, layout, page_indices: Sequence[int]) -> list[bool]:
        """Like :meth:`spill`, gathering each page from a strided host layout straight into staging."""
        return self._spill(kind, keys, None, layout, page_indices)

    def _spill(self, kind, keys, pages, layout, page_indices) -> list[bool]:
        out: list[bool] = []
        queued = 0
        try:
            keys = list(keys)  # any iterable; None or a non-iterable is caught below like any bad input
            n = len(keys)
            out = [False] * n
            kind = PayloadKind.parse(kind)
            st = self._kinds[kind]
            if self._closed:
                return out
            chashes: list[bytes | None] = []
            for k in keys:
                try:
                    chashes.append(key_to_bytes(k))
                except ValueError:
                    chashes.append(None)
            ikeys = [self._ikey(kind, h) if h is not None else None for h in chashes]
            present = self.index.get_many([k for k in ikeys if k is not None])
            present_it = iter(present)
            durable = [next(present_it) is not None if k is not None else False for k in ikeys]
            pb = st.page_bytes
            for i in range(n):
                if chashes[i] is None:
                    self.c.dropped_bad_input += 1
                    continue
                if durable[i]:
                    self.c.dedup += 1
                    out[i] = True
                    continue
                with self._lock:
                    if (kind, chashes[i]) in self._staged:
                        self.c.dedup += 1
                        out[i] = True
                        continue
                    if self._enq_seq - self._done_seq >= self.config.max_inflight:
                        self.c.dropped_staging += 1
                        continue
                buf = self._staging.acquire(kind)
                if buf is None:
                    self.c.dropped_staging += 1
                    continue
                try:
                    dst = np.frombuffer(buf.view, dtype=np.uint8)
                    if layout is None:
                        src = _page_view(pages[i], writable=False)
                        if src.nbytes != pb:
                            raise ValueError(f"page {i} has {src.nbytes} B, expected {pb}")
                        np.copyto(dst[HEADER_SIZE:HEADER_SIZE + pb], src)
                    else:
                        layout.gather_into(page_indices[i], buf.view, HEADER_SIZE)
                    tail = st.slot_bytes - HEADER_SIZE - pb
                    if tail:
                        dst[HEADER_SIZE + pb:].fill(0)  # no stale bytes of an older page in the pad
                except Exception:
                    self._staging.release(kind, buf)
                    self.c.dropped_bad_input += 1
                    continue
                with self._cond:
                    if (kind, chashes[i]) in self._staged:  # raced with another spiller of the same page
                        self._staging.release(kind, buf)
                        self.c.dedup += 1
                        out[i] = True
                        continue
                    self._enq_seq += 1
                    item = _Staged(self._enq_seq, kind, chashes[i], ikeys[i], buf)
                    self._staged[(kind, chashes[i])] = item
                    self._queue.append(item)
                    queued += 1
                    # Wake the writer once a batch is full or at the end of this call, not per page: a
                    # per-page wake-up hands it partial batches (one fdatasync + commit each) under CPU load.
                    if len(self._queue) >= self.config.write_batch_pages:
                        self._cond.notify()
                out[i] = True
            self.c.spill_accepted += sum(out)
        except Exception:
            log.exception("L3 spill failed; pages dropped")
            self.c.data_path_errors += 1
        finally:
            if queued:  # also after a failure part-way: what was queued must not wait for the next call
                with self._cond:
                    self._cond.notify()
        return out

    # ------------------------------------------------------------------ exists
    def exists(self, kind, keys: Sequence) -> int:
        """Length of the contiguous prefix of ``keys`` whose index entries are committed (durable)."""
        try:
            kind = PayloadKind.parse(kind)
            base = self.dep + self.ns + bytes((int(kind),))
            ikeys = []
            for k in keys:
                try:
                    ikeys.append(base + key_to_bytes(k))
                except ValueError:
                    break
            return self.index.prefix_len(ikeys)
        except Exception:
            self.c.data_path_errors += 1
            return 0

    # ------------------------------------------------------------------ reload
    def reload_into(self, kind, keys: Sequence, dsts: Sequence) -> list[bool]:
        """Read each page into ``dsts[i]``: a writable, C-contiguous buffer of at least page_bytes (the page lands
        in its first page_bytes, in memory order). True only if the blob verified AND its bytes are now in the
        caller's buffer. A destination that cannot take the page in place (strided, Fortran-ordered, read-only,
        too small) is a miss counted in ``reload_bad_dst`` and is left untouched; on any other False the
        destination's contents are unspecified."""
        return self._reload(kind, keys, dsts, None, None)

    def reload_into_layout(self, kind, keys: Sequence, layout, page_indices: Sequence[int]) -> list[bool]:
        return self._reload(kind, keys, None, layout, page_indices)

    def _read_buf(self, nbytes: int) -> AlignedBuffer:
        bufs = getattr(self._tls, "bufs", None)
        if bufs is None:
            bufs = self._tls.bufs = {}
        b = bufs.get(nbytes)
        if b is None:
            b = bufs[nbytes] = AlignedBuffer(nbytes)
        return b

    def _reader(self, rank: int, disk: int, kind: PayloadKind) -> ReadOnlySlab | None:
        key = (rank, disk, kind)
        r = self._readers.get(key)
        if r is not None or key in self._readers:
            return r
        with self._readers_lock:
            if key not in self._readers:
                try:
                    if not (0 <= disk < len(self.config.disks)):
                        raise OSError("disk index outside this config")
                    self._readers[key] = ReadOnlySlab(slab_path(self.config, rank, kind, disk),
                                                      self._kinds[kind].slot_bytes)
                except OSError:
                    # Slab not there (yet): a miss now; retry on a later reload.
                    return None
            return self._readers[key]

    def _reload_one(self, st: _KindState, chash: bytes, e: IndexEntry, dst, layout, pidx) -> tuple[bool, str]:
        if layout is not None:
            if isinstance(pidx, bool) or not isinstance(pidx, (int, np.integer)) or not 0 <= pidx < layout.num_pages:
                return False, f"bad_dst:page index {pidx!r} outside the layout's {layout.num_pages} pages"
            pidx = int(pidx)
        else:
            # Checked before any I/O: a destination we cannot write in place is the caller's problem, not the
            # page's (no verify-failure reclaim), and never an acknowledged page.
            try:
                d = _page_view(dst, writable=True)
            except (TypeError, ValueError) as ex:
                return False, f"bad_dst:{ex}"
            if d.nbytes < st.page_bytes:
                return False, f"bad_dst:{d.nbytes} B is smaller than the {st.page_bytes} B page"
        rd = self._reader(e.rank, e.disk, st.kind)
        if rd is None:
            return False, "no_slab"
        buf = self._read_buf(st.slot_bytes)
        got = rd.read_slot_into(e.slot, buf, st.slot_bytes)
        if got != st.slot_bytes:
            return False, "short_read"
        payload, reason = verify_blob_reason(buf.view, kind=st.kind, content_hash=chash, ns_digest=self.ns,
                                             payload_len=st.page_bytes)
        if payload is None:
            return False, reason
        if layout is None:
            np.copyto(d[:st.page_bytes], np.frombuffer(payload, dtype=np.uint8))
        else:
            layout.scatter_from(pidx, buf.view, HEADER_SIZE)
        return True, "ok"

    def _reload(self, kind, keys, dsts, layout, page_indices) -> list[bool]:
        out: list[bool] = []
        try:
            keys = list(keys)
            n = len(keys)
            out = [False] * n
            kind = PayloadKind.parse(kind)
            st = self._kinds[kind]
            # Each page stands alone: a malformed key, a missing destination or page index costs its own page.
            chashes = []
            for k in keys:
                try:
                    chashes.append(key_to_bytes(k))
                except ValueError:
                    chashes.append(None)
            ikeys = [self._ikey(kind, h) if h is not None else None for h in chashes]
            targets = _per_page(dsts if layout is None else page_indices, n)
            entries = self.index.get_many(ikeys)
            jobs = [i for i in range(n) if entries[i] is not None]

            def run(i):
                try:
                    return self._reload_one(st, chashes[i], entries[i], targets[i] if layout is None else None,
                                            layout, targets[i] if layout is not None else None)
                except Exception as ex:  # EIO on read, bad dst, ... -> miss
                    return False, f"error:{type(ex).__name__}"

            if len(jobs) > 1 and self.config.reload_threads > 1:
                results = list(self._reload_pool.map(run, jobs))
            else:
                results = [run(i) for i in jobs]
            ts = now_us()
            touched, bad = [], []
            for i, (ok, reason) in zip(jobs, results):
                if ok:
                    out[i] = True
                    touched.append(i)
                elif reason.startswith("bad_dst:"):
                    self.c.reload_bad_dst += 1
                    self._warn_once("bad_dst", "L3 reload: destination refused (%s); the page is a miss", reason[8:])
                elif reason != "no_slab" and not reason.startswith("error:"):
                    # The entry points at bytes that are not this page: reclaim it (conditionally) via the writer.
                    self.c.verify_failures += 1
                    bad.append(i)
                else:
                    self.c.data_path_errors += reason.startswith("error:")
            hits = sum(out)
            self.c.reload_hits += hits
            self.c.reload_misses += n - hits
            # Coalesced per page, not queued per hit: what waits for the writer is bounded by the pages there are,
            # however many hits arrive while it is busy (a stalled disk), and the GC heap gets one push per page
            # per writer round.
            with self._cond:
                for i in touched:
                    self._touch_in[(kind, ikeys[i])] = (entries[i], ts)
                for i in bad:
                    self._bad_in[(kind, ikeys[i])] = entries[i]
                self._cond.notify()
        except Exception:
            log.exception("L3 reload failed; pages are misses")
            self.c.data_path_errors += 1
        return out

    def _warn_once(self, what: str, msg: str, *args) -> None:
        """Caller bugs on the data path are counted every time and logged once per store (no log flood)."""
        if what not in self._warned:
            self._warned.add(what)
            log.warning(msg, *args)

    # ------------------------------------------------------------------ free / clear / flush
    def free(self, kind, keys: Sequence) -> None:
        """Remove pages from L3 (index entry first, then this rank's slot). Staged copies are cancelled."""
        try:
            kind = PayloadKind.parse(kind)
            ikeys = []
            with self._cond:
                for k in keys:
                    try:
                        h = key_to_bytes(k)
                    except ValueError:
                        continue
                    item = self._staged.get((kind, h))
                    if item is not None:
                        item.cancelled = True
                    ikeys.append(self._ikey(kind, h))
                self._ctl_enq += 1
                self._ctl.append(("free", kind, ikeys, None))
                self._cond.notify()
        except Exception:
            self.c.data_path_errors += 1

    def clear(self, timeout: float = 60.0) -> bool:
        """Drop everything this rank owns (this deployment only) and wait for it. Counters are not reset.
        True only if everything was dropped in time; False if the index could not delete it all (the pages
        that survive stay present and consistent) or the writer did not get to it within ``timeout``."""
        ev = _Signal()
        with self._cond:
            for item in self._staged.values():
                item.cancelled = True
            self._ctl_enq += 1
            self._ctl.append(("clear", None, None, ev))
            self._cond.notify()
        return ev.wait(timeout) and ev.ok

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Wait until everything spilled or freed before this call is durable (or dropped), and the writer has
        run GC back under its watermarks. For tests, benchmarks and shutdown. True if done in time."""
        deadline = None if timeout is None else time.monotonic() + timeout

        def wait_for(pred) -> bool:
            while not pred():
                if not self._writer.is_alive():
                    return False
                rem = None if deadline is None else deadline - time.monotonic()
                if rem is not None and rem <= 0:
                    return False
                self._cond.wait(min(rem, 1.0) if rem is not None else 1.0)
            return True

        with self._cond:
            target, ctl_target = self._enq_seq, self._ctl_enq
            if not wait_for(lambda: self._done_seq >= target and self._ctl_done >= ctl_target):
                return False
            # Phase 2: a barrier through the control queue; the writer completes every inflight commit and
            # finishes GC before acknowledging it.
            self._ctl_enq += 1
            barrier = self._ctl_enq
            self._ctl.append(("barrier", None, None, None))
            self._cond.notify_all()
            return wait_for(lambda: self._ctl_done >= barrier)

    # ------------------------------------------------------------------ writer thread
    def _writer_main(self) -> None:
        batch_max = self.config.write_batch_pages
        while True:
            with self._cond:
                while (not self._queue and not self._ctl and not self._stop and not self._completed
                       and not self._touch_in and not self._bad_in
                       and not any(s.gc_active for s in self._kinds.values())):
                    self._cond.wait(0.5 if (self._touch_pending or self._commits_inflight)
                                    else _READER_CHECK_INTERVAL_S)
                    if self._touch_pending or self._commits_inflight:
                        break
                if self._stop and not self._queue and not self._ctl and not self._commits_inflight:
                    break
                if self._queue and len(self._queue) < batch_max and not self._stop:
                    # Let a burst fill the batch: one fdatasync + one commit per batch, not per page.
                    self._cond.wait(_MAX_BATCH_WAIT_S)
                batch = [self._queue.popleft() for _ in range(min(batch_max, len(self._queue)))]
            try:
                self._complete_batches(block=False)
                self._drain_ctl()
                self._gc_round()
                if batch:
                    self._submit_batch(batch)
                    batch = []
                self._maybe_persist_touches()
                self._maybe_reader_check()
            except Exception:  # the writer must outlive any single failure
                log.exception("L3 writer round failed")
                self.c.data_path_errors += 1
                with self._cond:
                    for it in batch:
                        self._finish_item(it)
                    self._cond.notify_all()
        self._complete_batches(block=True)
        self._commit_q.put(None)
        self._committer.join()
        self._maybe_persist_touches(force=True)

    def _finish_item(self, it: _Staged) -> None:
        """Under self._cond. Release staging and mark done exactly once."""
        if it.buf is not None:
            self._staging.release(it.kind, it.buf)
            it.buf = None
        if self._staged.get((it.kind, it.chash)) is it:
            del self._staged[(it.kind, it.chash)]
        self._done_seq += 1

    # Pipeline: the writer allocates, seals and submits batch N+1 while the committer waits for batch N's
    # writes, fdatasyncs and commits its index entries. The committer never touches a pool or the GC: it hands
    # each finished batch back (self._completed) and the writer frees / registers slots. So pools keep one owner.
    def _submit_batch(self, batch: list[_Staged]) -> None:
        pending = []  # (item, state, slot, future)
        skipped = []
        for it in batch:
            st = self._kinds[it.kind]
            if it.cancelled:
                skipped.append(it)
                continue
            slot = st.pool.alloc()
            if slot is None:
                self._gc_reclaim(st, self.config.gc_budget_per_round)
                slot = st.pool.alloc()
            if slot is None:
                self.c.dropped_pool_full += 1
                skipped.append(it)
                continue
            try:
                seal_blob(it.buf.view, kind=it.kind, content_hash=it.chash, ns_digest=self.ns,
                          payload_len=st.page_bytes)
                fut = self._io.submit(_write_slot, st.slab, slot, it.buf)
            except Exception as e:
                self._write_failed(st, slot, _failure(e))
                skipped.append(it)
                continue
            pending.append((it, st, slot, fut))
        if skipped:
            with self._cond:
                for it in skipped:
                    self._finish_item(it)
                self._cond.notify_all()
        if pending:
            with self._cond:
                self._commits_inflight += 1
            self._commit_q.put(pending)  # bounded: a slow disk stalls the writer, never the callers

    def _committer_main(self) -> None:
        while True:
            pending = self._commit_q.get()
            if pending is None:
                return
            try:
                result = self._commit_batch(pending)
            except Exception as e:  # never lose a batch: report every page as failed
                log.error("L3 commit stage failed: %s", _failure(e))
                result = [(it, st, slot, "error", _failure(e)) for it, st, slot, _ in pending]
            pending = None  # nothing of this batch stays referenced while waiting for the next
            with self._cond:
                self._completed.append(result)
                self._cond.notify_all()

    def _commit_batch(self, pending) -> list:
        """Committer thread: wait for writes, fdatasync once per slab, commit the index in one transaction.
        Returns (item, state, slot, outcome, detail) per page; outcome in ok / dedup / write_error / index_full /
        cancelled."""
        out = []
        written = []
        for it, st, slot, fut in pending:
            failed = fut.result()  # _write_slot returns its failure as plain data; it never raises
            if failed is None:
                written.append((it, st, slot))
            else:
                out.append((it, st, slot, "write_error", failed))
        bad = {}
        for st in {id(s): s for _, s, _ in written}.values():
            try:
                st.slab.sync()
            except Exception as e:
                bad[st.kind] = _failure(e)
        synced = []
        for it, st, slot in written:
            if st.kind in bad:
                out.append((it, st, slot, "write_error", bad[st.kind]))
            elif it.cancelled:
                out.append((it, st, slot, "cancelled", None))
            else:
                synced.append((it, st, slot))
        if synced:
            ts = now_us()
            res = self.index.commit_puts([(it.ikey, IndexEntry(self.rank, self.disk, slot, ts))
                                          for it, st, slot in synced])
            for j, (it, st, slot) in enumerate(synced):
                if res is None:
                    out.append((it, st, slot, "index_full", None))
                elif res[j] is None:
                    out.append((it, st, slot, "ok", ts))
                else:
                    out.append((it, st, slot, "dedup", None))
        return out

    def _complete_batches(self, block: bool) -> None:
        """Writer thread: apply committed batches to the pools / GC. ``block`` waits for every inflight batch
        (a barrier before free / clear / stop, so no commit can land after them)."""
        while True:
            with self._cond:
                if block:
                    while self._commits_inflight and not self._completed:
                        self._cond.wait(1.0)
                if not self._completed:
                    return
                results = self._completed.popleft()
            for it, st, slot, outcome, detail in results:
                if outcome == "ok":
                    self.c.spilled += 1
                    st.current[it.ikey] = (detail, slot)
                    self._heap_push(st, detail, it.ikey, slot)
                elif outcome == "write_error":
                    self._write_failed(st, slot, detail)
                elif outcome == "error":
                    # Unknown whether the index commit happened: keep the slot allocated (a leak until the
                    # next clear / load) rather than risk handing out a slot an entry may reference.
                    self.c.write_errors += 1
                else:
                    if outcome == "dedup":  # someone stored the same page first: our copy is unreferenced
                        self.c.dedup += 1
                    elif outcome == "index_full":
                        self.c.index_full += 1
                    st.pool.free(slot)
            with self._cond:
                self._commits_inflight -= 1
                for it, *_ in results:
                    self._finish_item(it)
                self._cond.notify_all()

    def _write_failed(self, st: _KindState, slot: int, err) -> None:
        self.c.write_errors += 1
        if err is not None:
            log.warning("L3 write of %s slot %d failed: %s", st.kind.label, slot, err)
        st.pool.free(slot)

    def _drain_ctl(self) -> None:
        with self._lock:
            touches, self._touch_in = self._touch_in, {}
            bads, self._bad_in = self._bad_in, {}
        for (kind, ikey), entry in bads.items():
            # exact: the reader saw this entry some time ago; only that very commit is known to be bad, never a
            # newer commit of the same page into the same slot.
            self._reclaim_keys(kind, [(ikey, entry)], counter=None, exact=True)
        while self._ctl:
            op, kind, a, b = self._ctl.popleft()
            # Every counted operation signals completion, also when it fails: flush() waits for _ctl_done and
            # clear() for its signal, so one failure skipping them would make every later flush/clear time out.
            ok = False
            try:
                self._complete_batches(block=True)  # barrier: no commit of an older spill lands after this op
                if op == "free":
                    self._free_keys(kind, a)
                elif op == "clear":
                    ok = self._do_clear()
                elif op == "barrier":
                    for _ in range(1_000_000):  # bounded rounds until every pool is back under its watermark
                        if not any(st.gc_active for st in self._kinds.values()):
                            break
                        if not self._gc_round():
                            break
            except Exception as e:
                log.error("L3 %s failed: %s", op, _failure(e))
                self.c.data_path_errors += 1
            finally:
                if op == "clear":
                    b.ok = ok
                    b.set()
                with self._cond:
                    self._ctl_done += 1
                    self._cond.notify_all()
        for (kind, ikey), (entry, ts) in touches.items():
            st = self._kinds[kind]
            if entry.rank == self.rank and entry.disk == self.disk:
                cur = st.current.get(ikey)
                if cur is not None and cur[1] == entry.slot and ts > cur[0]:
                    st.current[ikey] = (ts, entry.slot)
                    self._heap_push(st, ts, ikey, entry.slot)
            # Persist for other ranks' GC (and for a later `load`), coalesced.
            self._touch_pending[ikey] = max(ts, self._touch_pending.get(ikey, 0))

    def _maybe_reader_check(self) -> None:
        """Clear dead processes' LMDB reader slots now and then (a SIGKILLed rank's slot pins old pages)."""
        now = time.monotonic()
        if now - self._reader_checked_at >= _READER_CHECK_INTERVAL_S:
            self._reader_checked_at = now
            self.index.reader_check()

    def _maybe_persist_touches(self, force: bool = False) -> None:
        if not self._touch_pending:
            return
        if not force and time.monotonic() - self._touch_flushed_at < _TOUCH_PERSIST_INTERVAL_S:
            return
        items = list(self._touch_pending.items())
        self._touch_pending.clear()
        self._touch_flushed_at = time.monotonic()
        try:
            self.index.touch_many(items)
        except Exception:
            self.c.data_path_errors += 1

    def _free_keys(self, kind: PayloadKind, ikeys: list[bytes]) -> None:
        entries = self.index.get_many(ikeys)
        self._reclaim_keys(kind, [(k, e) for k, e in zip(ikeys, entries) if e is not None], counter="freed")

    def _reclaim_keys(self, kind: PayloadKind, items: list[tuple[bytes, IndexEntry]], counter: str | None,
                      exact: bool = False) -> None:
        """Conditionally delete entries (same location; ``exact``: same entry), commit, THEN free our slots."""
        if not items:
            return
        res = self.index.delete_if(items, exact=exact)
        if res is None:
            self.c.index_full += 1
            return
        st = self._kinds[kind]
        for (ikey, e), deleted in zip(items, res):
            if deleted is not True:
                continue
            if counter:
                setattr(self.c, counter, getattr(self.c, counter) + 1)
            if e.rank == self.rank and e.disk == self.disk:
                cur = st.current.pop(ikey, None)
                if cur is not None and cur[1] == e.slot:
                    st.pool.free(e.slot)
                elif cur is not None:
                    st.current[ikey] = cur

    def _do_clear(self) -> bool:
        """Writer thread. True if every entry of this (deployment, rank) is gone.

        Invariant 3 holds whatever the index did: the pools are reset only to what the index still references.
        A delete that failed or stopped partway (map full after some chunks committed) leaves entries that point
        at this rank's slots; those slots stay allocated (and their pages present, in the GC), so they are never
        handed out again while an entry names them."""
        with self._cond:
            while self._queue:
                it = self._queue.popleft()
                self._finish_item(it)
            self._cond.notify_all()
        ok = True
        try:
            self.index.delete_for(self.dep, self.rank)
        except Exception as e:
            log.error("L3 clear: index delete failed: %s", _failure(e))
            self.c.data_path_errors += 1
            ok = False
        survivors: list[tuple[bytes, IndexEntry]] = []
        if not ok:
            try:
                survivors = [(k, e) for k, e in self.index.scan(self.dep).items if e.rank == self.rank]
            except Exception as e:
                # What survived is unknown: keep every slot as it is (a leak until the next cold start) rather
                # than free a slot an entry may still name.
                log.error("L3 clear: cannot list surviving entries, keeping every slot: %s", _failure(e))
                return False
        for st in self._kinds.values():
            self._rebuild_kind(st, [(k, e) for k, e in survivors if k[24] == int(st.kind)])
        self._touch_pending.clear()
        return ok

    def _rebuild_kind(self, st: _KindState, entries: list[tuple[bytes, IndexEntry]]) -> None:
        """Pool, LRU map and heap of one kind := exactly the given entries of this rank that name this disk.
        Entries of another namespace keep their slot allocated without joining the GC (reclaimed at the next
        cold start, which drops other namespaces)."""
        live, current = set(), {}
        for k, e in entries:
            if e.disk != self.disk or not 0 <= e.slot < st.num_slots or e.slot in live:
                continue
            live.add(e.slot)
            if k[8:24] == self.ns:
                current[k] = (e.last_access, e.slot)
        st.pool.rebuild_from_allocated(sorted(live))
        st.current = current
        st.heap = [(la, j, k, sl) for j, (k, (la, sl)) in enumerate(current.items(), start=self._gc_seq + 1)]
        self._gc_seq += len(st.heap)
        heapq.heapify(st.heap)
        st.gc_active = False

    # ------------------------------------------------------------------ GC
    def _heap_push(self, st: _KindState, last_access: int, ikey: bytes, slot: int) -> None:
        """Push onto the lazy-deletion heap, compacting it when stale items outnumber live ones.

        Invariant: ``len(st.heap) <= 2 * len(st.current) + _HEAP_SLACK`` after every push, so the heap's memory is
        bounded by the live pages however many touches arrive below gc.start (where nothing pops). A compaction
        rebuilds the heap from ``st.current`` (the authority) in O(live); it runs after at least live + slack pushes,
        so its cost per push is O(1) amortised."""
        self._gc_seq += 1
        heapq.heappush(st.heap, (last_access, self._gc_seq, ikey, slot))
        if len(st.heap) > 2 * len(st.current) + _HEAP_SLACK:
            st.heap = [(la, j, k, sl) for j, (k, (la, sl)) in enumerate(st.current.items(), start=self._gc_seq + 1)]
            self._gc_seq += len(st.heap)
            heapq.heapify(st.heap)

    def _gc_round(self) -> int:
        """One bounded GC round per pool over its start watermark. Returns pages reclaimed."""
        cfg = self.config
        n = 0
        for st in self._kinds.values():
            used = st.pool.used / st.num_slots
            if not st.gc_active and used >= cfg.gc_start:
                st.gc_active = True
            if st.gc_active:
                target = int(cfg.gc_stop * st.num_slots)
                n += self._gc_reclaim(st, min(cfg.gc_budget_per_round, max(0, st.pool.used - target)))
                if st.pool.used <= target or not st.current:
                    st.gc_active = False
        return n

    def _gc_reclaim(self, st: _KindState, budget: int) -> int:
        """Reclaim up to ``budget`` of the coldest pages. Index delete commits before any slot is freed."""
        victims = []
        while st.heap and len(victims) < budget:
            la, _, ikey, slot = heapq.heappop(st.heap)
            if st.current.get(ikey) != (la, slot):
                continue  # stale heap item (touched, freed or reclaimed since)
            victims.append((ikey, IndexEntry(self.rank, self.disk, slot, la)))
        if not victims:
            return 0
        res = self.index.delete_if(victims, newer_than_wins=True)
        if res is None:  # could not commit: keep them, try next round
            for ikey, e in victims:
                self._heap_push(st, e.last_access, ikey, e.slot)
            self.c.index_full += 1
            return 0
        n = 0
        for (ikey, e), r in zip(victims, res):
            if isinstance(r, IndexEntry):  # another rank touched it since: it is warm, keep it
                st.current[ikey] = (r.last_access, e.slot)
                self._heap_push(st, r.last_access, ikey, e.slot)
                continue
            # True: deleted now. False: the entry is gone or names another location, so our slot is unreferenced.
            del st.current[ikey]
            st.pool.free(e.slot)
            n += 1
        self.c.gc_reclaimed += n
        return n

    def slab(self, kind) -> Any:
        """This rank's writable ``DiskSlab`` for ``kind`` (fault injection in tests, diagnostics)."""
        return self._kinds[PayloadKind.parse(kind)].slab

    # ------------------------------------------------------------------ stats / close
    def stats(self) -> dict:
        with self._lock:
            qdepth = len(self._queue)
            inflight = self._enq_seq - self._done_seq
        out = {
            "rank": self.rank,
            "disk": self.disk,
            "cold_start": self.cold_start,
            "io_mode": {k.label: getattr(st.slab, "io_mode", None) for k, st in self._kinds.items()},
            "slots": {k.label: {"used": st.pool.used, "total": st.pool.total} for k, st in self._kinds.items()},
            "inflight": inflight,
            "write_queue_depth": qdepth,
            "control_queue_depth": len(self._ctl),
            "pending_touches": len(getattr(self, "_touch_in", ())),
            "gc_heap_items": sum(len(st.heap) for st in self._kinds.values()),
            "staging_bytes": self._staging.in_use,
            "staging_allocated_bytes": self._staging.allocated,
            "staging_peak_bytes": self._staging.peak_allocated,
            "staging_cap_bytes": self._staging.cap,
        }
        out.update(vars(self.c))
        out["index_full"] += self.index.index_full if self.index else 0
        out["index_stale_readers_cleared"] = self.index.stale_readers_cleared if self.index else 0
        out["index_damage_seen"] = self.index.damage_seen if self.index else 0
        return out

    def close(self, timeout: float = 30.0) -> None:
        if self._closed:
            return
        self.flush(timeout)
        with self._cond:
            self._stop = True
            self._closed = True
            self._cond.notify_all()
        self._writer.join(timeout)
        self._io.shutdown(wait=True)
        self._reload_pool.shutdown(wait=True)
        self._staging.close()
        self._close_files()

    def _close_files(self) -> None:
        for st in self._kinds.values():
            try:
                st.slab.close()
            except Exception:
                pass
        for r in self._readers.values():
            if r is not None:
                r.close()
        self._readers.clear()
        if self.index is not None:
            self.index.close()
            self.index = None
        if self._owner is not None:  # last: nothing of this rank is open any more
            self._owner.release()
            self._owner = None

    def __enter__(self) -> "L3Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
