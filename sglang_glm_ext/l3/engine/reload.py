"""Reading pages back for one store: the one owner of "read these pages into this destination".

A reload, top down (the store's ``reload_into`` / ``reload_into_layout`` hand :meth:`Reloader.reload` the call once):

* :meth:`Reloader.reload`: the read path's one error net (below), around
* :meth:`Reloader._plan`: each key's index entry (one read txn) or staged copy, and each destination checked against
  the kind before any byte moves: the call's :class:`PageRead` list;
* :meth:`Reloader._run`: the reads grouped into units (:func:`~.coalesce.coalesce`: pages in adjacent slots of one
  slab, in slot order, read in one transfer) and run on the read pool, checksums overlapping the next reads
  (:class:`~.read_batch.ReadBatch`); each unit is :meth:`Reloader._read_unit`: a run of adjacent slots
  (:meth:`Reloader._land_run`, which answers None where the run cannot be one transfer) or each page alone
  (:meth:`Reloader._land_one`); then :meth:`Reloader._check`, the payload checksum where the bytes landed;
* :meth:`Reloader._account`: counters, LRU touches and the reclaim of entries whose bytes failed, posted to the
  writer.

A page is read straight into its destination (format v2 puts the payload at the slot's start): a page-first
page with one O_DIRECT transfer into the host page, a layer-first page with one vectored transfer into each
layer's chunk. Only what the alignment the slab's file system reports cannot take (a chunk's unaligned head or
tail, the pad and the header, a destination whose address does not fit) goes through a small per-thread bounce
buffer (read_plan.py). Then the header is checked, and the payload checksum is computed over the bytes where
they landed; a page that fails is a miss. A run is read in one transfer (each page's spans and its own pad and
header, nothing else: ``SlabReader.read_run``), then each page is checked as if it were read alone; a run whose
transfer fails or whose pages cannot share one plan is read page by page. Two pages of one call with the same
destination are refused (the second is a ``bad_dst`` miss): one read could otherwise land over another's verified
bytes.

Errors. What decides a page's answer is mapped where it is known: a slot past the file's end (``ShortRead``: the
entry names no page, reclaimed) and an I/O error (``OSError``: an ``error`` miss counted against its disk, the entry
kept) on a page's own read, and a run's failed transfer (each page read alone). A step that raises anything else
costs only its own pages (``ReadBatch``: a unit's read its unit's pages, a checksum its page), and anything that
raises outside a step (the plan, the accounting) makes the call's pages misses at :meth:`Reloader.reload`, counted in
``data_path_errors`` and logged: nothing reaches the caller.

Contract (what a caller gets, also in ``L3Store.reload_into``): True means the verified page is in the
destination. False means a miss, and the destination page's own bytes may have been overwritten (the read lands
there before it can be verified), never a byte outside them. SGLang never uses a page reported missing: its
controller counts only the prefix of hits (``cache_controller.py:1113-1127``, ``_page_get_zero_copy``) and the
radix cache inserts ``host_indices[:completed_tokens]`` and frees the rest (``unified_radix_cache.py:2367-2369,
2472-2477``), so a clobbered page is a free host page that is written before it is read again.

Readers are opened when the store opens, for every configured rank's slab that exists then; a slab that appears
later (a rank that starts after this one, an entry that names another disk) is opened by the first reload that
needs it, and until it exists its pages are misses. The hot path is a dict lookup. Any rank reads any rank's
blobs: readers take no lock (slab_reader.py says why that is safe).
"""

from __future__ import annotations

import bisect
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..config import L3Config
from ..disk.aligned import AlignedBuffer, byte_view, page_array
from ..disk.format import (HEADER_SIZE, PAYLOAD_OFFSET, BlobCheck, PayloadKind, check_header, checksum_views,
                           is_old_header, key_to_bytes, parse_header_reason)
from ..disk.host_layout import PageLayout, PageSpans
from ..disk.read_plan import plan_read
from ..disk.slab_dir import slab_path_for
from ..disk.slab_reader import ShortRead, SlabReader
from .coalesce import coalesce
from . import latency
from .counters import Counters
from .index import IndexEntry, KeySpace, L3Index, now_us
from .kinds import KindState
from .messages import ReloadMiss, Touch
from .read_batch import HAND_OFF_BELOW, Landed, ReadBatch, hash_helpers
from .staging import StagedPages

log = logging.getLogger(__name__)

__all__ = ["HAND_OFF_BELOW", "PageRead", "Reloader", "blames_entry", "content_hashes", "hash_helpers",
           "layout_mismatch"]

# Layer-first pages are read with one vectored O_DIRECT transfer into the layer chunks (``queues.layer_first_reads``
# = "vectored", the default: the least CPU where measured) or one transfer of the whole slot into a bounce buffer,
# checked there and copied out only once it matched ("single": the fork's choice, seed 487-497). Their chunks are
# hashed with xxhash's update(), which holds the GIL (releasing it per chunk cost CPU and bought no throughput);
# ``queues.layer_first_gil_pause`` lets the checksum give it up. The measurements behind each choice:
# docs_internal/l3_design.md, "Read-path measurements moved from engine/reload.py".

# Misses that say nothing against the index entry: the slab is not there (yet), or the blob is of a format version
# this build does not know (a newer server's page during a rolling upgrade: not ours to reclaim).
_NOT_BLAMED = frozenset({ReloadMiss.NO_SLAB, ReloadMiss.BAD_DST, ReloadMiss.ERROR, BlobCheck.UNKNOWN_VERSION})


def blames_entry(why) -> bool:
    """Does this miss mean the entry names bytes that are not its page (so it is reclaimed)? Every blob check but
    ``unknown_version`` (an old-version blob is never served by this build: it is reclaimed like a stale one)."""
    return why not in _NOT_BLAMED


def content_hashes(keys: list) -> list["bytes | None"]:
    """Each page key as its 32 raw bytes, or None for a key that is not one (it costs only its own page)."""
    out: list[bytes | None] = []
    for k in keys:
        try:
            out.append(key_to_bytes(k))
        except ValueError:
            out.append(None)
    return out


def _per_page(seq, n: int) -> list:
    """``seq`` as a list of exactly ``n`` items, None-padded (a short or missing list costs only its missing pages)."""
    try:
        items = list(seq) if seq is not None else []
    except TypeError:
        items = []
    return (items + [None] * n)[:n]


@dataclass(slots=True)
class PageRead:
    """One page of a call that has bytes to deliver, its destination checked."""
    i: int  # its position in the call's keys and answers
    content_hash: bytes
    where: Any  # a flat destination (a writable byte array) or a page index of the call's layout
    entry: "IndexEntry | None"  # the index entry its slab read follows (None: served from staging)
    staged: Any = None  # its staged copy (a reader reference, given back when the call ends), or None


@dataclass
class _Call:
    """One reload call, planned: per key (position), its index key, entry and staged copy; and the pages to read."""
    kind: PayloadKind
    st: KindState
    layout: "PageLayout | None"
    ikeys: list
    entries: list
    reads: "list[PageRead]"


class Reloader:
    """One store's read path. Invariant (the store's 4 and 5): :meth:`reload` never raises, one bad element costs
    only its own page, and True means the verified page is in the caller's destination."""

    def __init__(self, config: L3Config, rank: int, kinds: Mapping[PayloadKind, KindState], namespace: bytes, *,
                 index: L3Index, keys: KeySpace, staged: StagedPages, counters: Counters,
                 note_reloads: Callable[[PayloadKind, list, list], None], warn_once: Callable[..., None]):
        self.config = config
        self.namespace = namespace
        self.vectored = config.layer_first_reads == "vectored"  # layer-first pages (the comment above _NOT_BLAMED)
        self._kinds = kinds  # the store's own mapping: a kind it adds is seen here
        self._index, self._keys, self._staged, self.c = index, keys, staged, counters
        self._note_reloads, self._warn_once = note_reloads, warn_once
        self._slot_bytes = {k: st.slot_bytes for k, st in kinds.items()}
        self._readers: dict[tuple[int, int, PayloadKind], SlabReader] = {}
        self._lock = threading.Lock()
        self._tls = threading.local()
        # Pages inside a reload call right now (stats "reload_inflight"), under a lock: a lost += of a bare int
        # under a thread race would leave this gauge off for good (the counters tolerate a lost add; it does not).
        self.inflight = 0
        self._inflight_lock = threading.Lock()
        # Readers and hash helpers in pools of their own: a reader never waits on anything but its read, so the
        # readers of calls that run at the same time always progress, whatever the helpers do.
        self.pool = ThreadPoolExecutor(config.reload_threads, thread_name_prefix=f"l3-rd-r{rank}")
        self.helpers = hash_helpers(config.reload_threads)
        self.hash_pool = ThreadPoolExecutor(self.helpers, thread_name_prefix=f"l3-xxh-r{rank}")
        for r in range(config.num_ranks):
            for d in config.disks_for_rank(r):
                for kind in kinds:
                    self._open(r, d, kind)

    def add_kind(self, kind: PayloadKind, slot_bytes: int) -> None:
        """Readers of one more kind (``L3Store.add_kind``): opened by the first reload that needs each slab."""
        with self._lock:
            self._slot_bytes[kind] = slot_bytes

    # ------------------------------------------------------------------ the read path, top down
    def reload(self, kind, keys: Sequence, dsts=None, layout=None, page_indices=None) -> list[bool]:
        """Read each page into ``dsts[i]`` (flat destinations) or into page ``page_indices[i]`` of a ``PageLayout``
        (``layout``); the store's ``reload_into`` / ``reload_into_layout`` document what a caller gets. The read
        path's one error net: whatever raises under it costs the call's pages (misses, counted), never the caller."""
        try:
            keys = list(keys)
        except TypeError:
            pass  # the call below turns it into a counted failure
        n = len(keys) if isinstance(keys, list) else 0
        with self._inflight_lock:
            self.inflight += n
        out: list[bool] = []
        try:
            keys = list(keys)
            out = [False] * len(keys)
            with latency.of(self._index).reload.time():
                self._reload(PayloadKind.parse(kind), keys, dsts if layout is None else page_indices, layout, out)
        except Exception:
            log.exception("L3 reload failed; pages are misses")
            self.c.data_path_errors += 1
        finally:
            with self._inflight_lock:
                self.inflight -= n
        return out

    def _reload(self, kind: PayloadKind, keys: list, targets, layout, out: list) -> None:
        st = self._kinds[kind]
        hashes = content_hashes(keys)
        # A page still in staging is served from its buffer (reader references, given back below); staged first,
        # then the index, as in exists().
        borrowed = self._staged.borrow(kind, hashes)
        try:
            call = self._plan(kind, st, hashes, borrowed, _per_page(targets, len(keys)), layout)
            results = self._run(call)
        finally:
            self._staged.give_back(borrowed)
        self._account(call, results, out)

    def _plan(self, kind: PayloadKind, st: KindState, hashes: list, borrowed: list, targets: list,
              layout) -> _Call:
        """Each page's entry (one read txn) and destination. Each page stands alone: a malformed key, a missing
        destination or page index costs its own page. A destination that cannot take its page in place is the
        caller's problem, not the page's: a miss before any I/O, no reclaim. One check of the destination against
        the kind, before any byte moves, whether the page would come from staging or from the slab."""
        ikeys = [self._keys.key(kind, h) if h is not None else None for h in hashes]
        entries = self._index.get_many([ik if b is None else None for ik, b in zip(ikeys, borrowed)])
        layout_refused = layout_mismatch(st, layout) if layout is not None else ""
        taken = _Taken(st.page_bytes)
        reads: list[PageRead] = []
        for i, (h, e, b) in enumerate(zip(hashes, entries, borrowed)):
            if e is None and b is None:
                continue
            where, refused = (_destination(st, targets[i]) if layout is None
                              else (None, layout_refused) if layout_refused
                              else _page_index(layout, targets[i]))
            if refused is None:
                refused = taken.claim(where)
            if refused is None:
                reads.append(PageRead(i, h, where, e, b))
            else:
                self.c.reload_bad_dst += 1
                self._warn_once("bad_dst", "L3 reload: destination refused (%s); the page is a miss", refused)
        return _Call(kind, st, layout, ikeys, entries, reads)

    def _run(self, call: _Call) -> list:
        """Every read of the call, unit by unit on the read pool, checksums overlapping the next reads: a final
        ``(ok, why)`` per read, in ``call.reads`` order."""
        reads = call.reads
        units = coalesce([p.entry if p.staged is None else None for p in reads], slot_bytes=call.st.slot_bytes,
                         coalesce_bytes=self.config.read_coalesce_bytes, readers=self.config.reload_threads)
        batch = ReadBatch(lambda unit: self._read_unit(call, [reads[j] for j in unit]), self._check, len(reads),
                          pool=self.pool, hash_pool=self.hash_pool, helpers=self.helpers,
                          reload_threads=self.config.reload_threads)
        return batch.run(units)

    def _read_unit(self, call: _Call, pages: "list[PageRead]") -> list:
        """Stage 1 of one unit: a final ``(ok, why)`` or a :class:`Landed` page for each of ``pages``. A run of
        adjacent slots is one transfer; where it cannot be (:meth:`_land_run` answers None), each page is read
        alone, so an error costs only the page it is in."""
        if len(pages) > 1:
            landed = self._land_run(call.st, call.layout, pages)
            if landed is not None:
                return landed
        return [self._land_one(call.st, call.layout, p) for p in pages]

    def _land_one(self, st: KindState, layout, p: PageRead) -> "Landed | tuple[bool, object]":
        """One page's read and header check, or its staged copy."""
        if p.staged is not None:
            return _copy_staged(st, p.staged, p.where, layout)
        rd = self._reader(st, p.entry)
        if rd is None:
            return False, ReloadMiss.NO_SLAB
        spans, plan = self._spans_and_plan(st, layout, rd, p.where)
        try:
            # A single transfer (layer_first_reads = "single") is checked in the bounce buffer, in one call, and
            # copied out only once it matched (read_spans' verify_first); every other read lands in place.
            trailer, pieces, pending = rd.read_spans(p.entry.slot, spans, plan, self._bounce(plan.bounce_bytes),
                                                     verify_first=not self.vectored)
        except ShortRead:
            return False, ReloadMiss.SHORT_READ  # the file ends before the slot: the entry names no page
        except OSError:
            return False, ReloadMiss.ERROR  # EIO, ...: counted against its disk; the bytes were never seen
        return self._landed(rd, st, p.content_hash, spans, trailer, pieces, pending)

    def _land_run(self, st: KindState, layout, pages: "list[PageRead]") -> "list | None":
        """Stage 1 of pages in adjacent slots of one slab, in slot order (:func:`coalesce`): read in as few transfers
        as the kernel's iovec limit allows (:meth:`SlabReader.read_run`), each page then checked like a page read
        alone. None where the pages cannot share one plan (a destination off the others' alignment, a layout whose
        spans are not all direct), the transfer fails (EIO, the file ends) or the kernel refuses it: the caller
        reads each page alone."""
        rd = self._reader(st, pages[0].entry)
        if rd is None:
            return [(False, ReloadMiss.NO_SLAB)] * len(pages)
        first = pages[0].entry.slot
        spans_all, plan = [], None
        for q, p in enumerate(pages):
            spans, pq = self._spans_and_plan(st, layout, rd, p.where)
            if pq.tail is None or (plan is not None and pq is not plan and pq != plan) or p.entry.slot != first + q:
                return None
            plan = pq
            spans_all.append(spans)
        mem = rd.align.mem
        stride = -(-plan.bounce_bytes // mem) * mem
        try:
            got = rd.read_run(first, spans_all, plan, self._bounce((len(pages) - 1) * stride + plan.bounce_bytes),
                              stride)
        except OSError:  # EIO, the file ends inside the run (ShortRead): each page alone says which
            return None
        if got is None:  # refused: the reader fell back, and a page read alone re-plans
            return None
        return [self._landed(rd, st, p.content_hash, spans, trailer, pieces, None)
                for p, spans, (trailer, pieces) in zip(pages, spans_all, got)]

    def _spans_and_plan(self, st: KindState, layout, rd: SlabReader, where) -> tuple:
        """A page's destination spans and the plan of its read under ``rd``'s alignment."""
        if layout is None:
            spans = PageSpans.flat(byte_view(where), st.page_bytes)
            return spans, plan_read(spans.lengths, (spans.bases[0] % rd.align.mem,), st.slot_bytes, rd.align, True)
        spans = layout.page_spans(where)
        return spans, layout.read_plan(where, st.slot_bytes, rd.align, self.vectored or len(spans.lengths) == 1)

    def _landed(self, rd: SlabReader, st: KindState, content_hash: bytes, spans: PageSpans, trailer: bytes,
                pieces: list, pending) -> "Landed | tuple[bool, object]":
        """A read page's header checked against the page asked for: a miss with its reason, or the page's
        :class:`Landed` (its payload checksum still to run); a verify-first page (``pending``) is checked and
        copied here."""
        header, why = parse_header_reason(trailer)
        if header is None:
            head = bytes(pieces[0][:HEADER_SIZE]) if pending is not None else spans.head(HEADER_SIZE)
            if why in (BlobCheck.EMPTY, BlobCheck.BAD_MAGIC) and is_old_header(head):
                why = BlobCheck.OLD_VERSION  # a v1 blob: its header landed where the v2 payload starts
            return False, why
        why = check_header(header, kind=st.kind, content_hash=content_hash, ns_digest=self.namespace,
                           payload_len=st.page_bytes, slot_bytes=st.slot_bytes)
        if why is not BlobCheck.OK:
            return False, why
        if pending is not None:  # now, on this thread: its next read reuses the bounce buffer
            if checksum_views(pieces) != header.payload_checksum:
                return False, BlobCheck.PAYLOAD_CHECKSUM  # the destination was never touched
            np.copyto(*pending)
            rd.counters["strided_copies"] += 1
            return True, BlobCheck.OK
        # ``pieces`` are the spans' own bytes (read_spans: views of the destination, never of the bounce buffer this
        # thread reuses for its next read), so the checksum may run later, on another thread.
        return Landed(pieces, header.payload_checksum)

    def _check(self, landed: Landed) -> "tuple[bool, object]":
        """Stage 2: a landed page is a hit only once the checksum over its bytes where they landed matched."""
        ok = checksum_views(landed.pieces, gil_pause_bytes=self.config.layer_first_gil_pause_bytes) == landed.want
        return (True, BlobCheck.OK) if ok else (False, BlobCheck.PAYLOAD_CHECKSUM)

    def _account(self, call: _Call, results: list, out: list) -> None:
        """Counters, LRU touches of what was read, and the reclaim of entries whose bytes are not their page."""
        ts = now_us()
        touched, bad = [], []
        for p, (ok, why) in zip(call.reads, results):
            i = p.i
            if ok and p.staged is not None:
                out[i] = True
                self.c.reload_from_staging += 1
            elif ok:
                out[i] = True
                touched.append((call.ikeys[i], Touch(p.entry, ts)))
            elif why is ReloadMiss.ERROR:
                self.c.data_path_errors += 1
                if p.entry is not None:
                    self.c.read_error(p.entry.disk)  # which drive failed it (stats()["per_disk"])
            elif why is ReloadMiss.BAD_DST:
                self.c.reload_bad_dst += 1
            elif blames_entry(why):
                # The entry points at bytes that are not this page: reclaim it (conditionally) via the writer.
                self.c.verify_failures += 1
                bad.append((call.ikeys[i], p.entry))
        hits = sum(out)
        self.c.reload_hits += hits
        self.c.reload_misses += len(out) - hits
        self.c.reload_bytes += hits * call.st.page_bytes
        self._note_reloads(call.kind, touched, bad)

    # ------------------------------------------------------------------ readers
    def _reader(self, st: KindState, e: IndexEntry) -> "SlabReader | None":
        return self._readers.get((e.rank, e.disk, st.kind)) or self._open(e.rank, e.disk, st.kind)

    def _open(self, rank: int, disk: int, kind: PayloadKind) -> "SlabReader | None":
        key = (rank, disk, kind)
        with self._lock:
            if key not in self._readers:
                if not 0 <= disk < len(self.config.disks):
                    return None  # an entry naming a disk outside this config: a miss
                try:
                    sb = self._slot_bytes[kind]  # the slab of this page size (a kind may have several, slab_dir.py)
                    self._readers[key] = SlabReader(slab_path_for(self.config, rank, kind, sb, disk), sb)
                except OSError:
                    return None  # not there (yet): a miss now; retried by a later reload
            return self._readers[key]

    def _bounce(self, nbytes: int) -> AlignedBuffer:
        """This thread's bounce buffer, shared by every slab it reads (page-aligned, so any ``mem`` fits)."""
        b = getattr(self._tls, "bounce", None)
        if b is None or b.size < nbytes:
            if b is not None:
                try:
                    b.close()
                except BufferError:
                    pass
            b = self._tls.bounce = AlignedBuffer(nbytes)
        return b

    def io_counters(self) -> dict:
        """The readers' counters summed (diagnostics, tests, bench): span reads, bytes read straight into the
        destination vs copied from the bounce buffer."""
        with self._lock:
            readers = list(self._readers.values())
        out: dict = {}
        for rd in readers:
            for k, v in rd.counters.items():
                out[k] = out.get(k, 0) + v
        return out

    def readers(self) -> list[SlabReader]:
        """The slab views open now (diagnostics)."""
        with self._lock:
            return list(self._readers.values())

    def alignment(self) -> dict:
        """What each open reader's file system reported for direct I/O (diagnostics, bench)."""
        with self._lock:
            return {f"rank{r}/disk{d}/{k.label}": str(rd.align) for (r, d, k), rd in self._readers.items()}

    def shutdown(self) -> None:
        self.pool.shutdown(wait=True)
        self.hash_pool.shutdown(wait=True)

    def close_readers(self) -> None:
        with self._lock:
            readers, self._readers = list(self._readers.values()), {}
        for r in readers:
            r.close()


def layout_mismatch(st: KindState, layout) -> str:
    """'' when ``layout``'s pages are exactly this kind's page, else why not (spill and every reload path check it the
    same way, before any byte moves)."""
    have = getattr(layout, "page_bytes", None)
    if have != st.page_bytes:
        return f"the layout's pages are {have!r} B, {st.kind.label} pages are {st.page_bytes} B"
    return ""


def _destination(st: KindState, dst) -> "tuple[np.ndarray | None, str | None]":
    try:
        d = page_array(dst, writable=True)
    except (TypeError, ValueError) as ex:
        return None, str(ex)
    if d.nbytes < st.page_bytes:
        return None, f"{d.nbytes} B is smaller than the {st.page_bytes} B page"
    return d, None


class _Taken:
    """The destinations one call has handed out: a second page for bytes already taken is refused before any byte
    moves (its read could land over the first page's verified bytes after they were checked). Flat destinations
    are address ranges (overlap refused), layout destinations page indices."""

    def __init__(self, page_bytes: int):
        self.page_bytes = page_bytes
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.pages: set[int] = set()

    def claim(self, where) -> "str | None":
        if isinstance(where, int):
            if where in self.pages:
                return f"host page {where} is the destination of an earlier page of this call"
            self.pages.add(where)
            return None
        a = where.ctypes.data
        b = a + self.page_bytes
        j = bisect.bisect_right(self.starts, a)
        if (j and self.ends[j - 1] > a) or (j < len(self.starts) and self.starts[j] < b):
            return "the destination overlaps an earlier page's destination in this call"
        self.starts.insert(j, a)
        self.ends.insert(j, b)
        return None


def _page_index(layout, pidx) -> "tuple[int | None, str | None]":
    if isinstance(pidx, bool) or not isinstance(pidx, (int, np.integer)) or not 0 <= pidx < layout.num_pages:
        return None, f"page index {pidx!r} outside the layout's {layout.num_pages} pages"
    return int(pidx), None


def _copy_staged(st: KindState, page, dst, layout) -> "tuple[bool, Any]":
    """Deliver a staged page (the caller holds a reader reference) from its staging buffer's payload. No verify:
    these bytes never left memory."""
    if layout is None:
        np.copyto(dst[:st.page_bytes], np.frombuffer(page.buf.view, dtype=np.uint8, count=st.page_bytes,
                                                     offset=PAYLOAD_OFFSET))
    else:
        layout.scatter_from(dst, page.buf.view, PAYLOAD_OFFSET)
    return True, BlobCheck.OK
