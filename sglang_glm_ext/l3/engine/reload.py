"""Reading pages back for one store: the one owner of "read these pages into this destination".

:meth:`Reloader.reload` is the whole read path under the store's ``reload_into`` / ``reload_into_layout``, which
hand it the call once: plan (each key's index entry, or its staged copy; each destination checked against the kind
before any byte moves), run (the reads, spread over the read pool), account (counters, LRU touches and the
reclaim of entries whose bytes failed, posted to the writer). Under it: a slab reader per (rank, disk, kind),
per-thread bounce buffers, the read pool.

A page is read straight into its destination (format v2 puts the payload at the slot's start): a page-first
page with one O_DIRECT transfer into the host page, a layer-first page with one vectored transfer into each
layer's chunk. Only what the alignment the slab's file system reports cannot take (a chunk's unaligned head or
tail, the pad and the header, a destination whose address does not fit) goes through a small per-thread bounce
buffer (read_plan.py). Then the header is checked, and the payload checksum is computed over the bytes where
they landed; a page that fails is a miss.

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

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
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
from .counters import Counters
from .index import IndexEntry, KeySpace, L3Index, now_us
from .kinds import KindState
from .messages import ReloadMiss, Touch
from .staging import StagedPages

log = logging.getLogger(__name__)

__all__ = ["Reloader", "blames_entry", "content_hashes", "layout_mismatch", "VECTORED"]

# Layer-first pages: one vectored O_DIRECT read into each layer's chunk (True) or one transfer of the whole slot
# into a bounce buffer and a copy per chunk (False: the fork's choice, seed 487-497). Measured side by side with
# `sglang-glm-ext l3 bench` (docs_internal/l3_design.md, "Direct reads and restarts, measured"): vectored was both
# faster and cheaper here -- GLM-5 pages 1.17 vs 0.70 GB/s and 0.22 vs 0.36 CPU s/GB, 1 MiB pages (64 chunks)
# 0.74 vs 0.67 GB/s and 0.32 vs 0.40 CPU s/GB.
VECTORED = True

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


class Reloader:
    """One store's read path. Invariant (the store's 4 and 5): :meth:`reload` never raises, one bad element costs
    only its own page, and True means the verified page is in the caller's destination."""

    def __init__(self, config: L3Config, rank: int, kinds: Mapping[PayloadKind, KindState], namespace: bytes, *,
                 index: L3Index, keys: KeySpace, staged: StagedPages, counters: Counters,
                 note_reloads: Callable[[PayloadKind, list, list], None], warn_once: Callable[..., None]):
        self.config = config
        self.namespace = namespace
        self.vectored = VECTORED
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
        self.pool = ThreadPoolExecutor(config.reload_threads, thread_name_prefix=f"l3-rd-r{rank}")
        for r in range(config.num_ranks):
            for d in config.disks_for_rank(r):
                for kind in kinds:
                    self._open(r, d, kind)

    def add_kind(self, kind: PayloadKind, slot_bytes: int) -> None:
        """Readers of one more kind (``L3Store.add_kind``): opened by the first reload that needs each slab."""
        with self._lock:
            self._slot_bytes[kind] = slot_bytes

    # ------------------------------------------------------------------ the read path
    def reload(self, kind, keys: Sequence, dsts=None, layout=None, page_indices=None) -> list[bool]:
        """Read each page into ``dsts[i]`` (flat destinations) or into page ``page_indices[i]`` of a ``PageLayout``
        (``layout``); the store's ``reload_into`` / ``reload_into_layout`` document what a caller gets."""
        try:
            keys = list(keys)
        except TypeError:
            pass  # the call below turns it into a counted failure
        n = len(keys) if isinstance(keys, list) else 0
        with self._inflight_lock:
            self.inflight += n
        try:
            return self._reload(kind, keys, dsts, layout, page_indices)
        finally:
            with self._inflight_lock:
                self.inflight -= n

    def _reload(self, kind, keys, dsts, layout, page_indices) -> list[bool]:
        out: list[bool] = []
        try:
            keys = list(keys)
            n = len(keys)
            out = [False] * n
            kind = PayloadKind.parse(kind)
            st = self._kinds[kind]
            # Plan: keys, entries (one read txn), and where each found page lands. Each page stands alone: a
            # malformed key, a missing destination or page index costs its own page. A destination that cannot
            # take its page in place is the caller's problem, not the page's: a miss before any I/O, no reclaim.
            hashes = content_hashes(keys)
            ikeys = [self._keys.key(kind, h) if h is not None else None for h in hashes]
            targets = _per_page(dsts if layout is None else page_indices, n)
            # A page still in staging is served from its buffer (reader references, given back below); staged
            # first, then the index, as in exists().
            layout_refused = layout_mismatch(st, layout) if layout is not None else ""
            borrowed = self._staged.borrow(kind, hashes)
            try:
                entries = self._index.get_many([ik if borrowed[i] is None else None for i, ik in enumerate(ikeys)])
                jobs: list[tuple[int, Any]] = []
                for i in range(n):
                    if entries[i] is None and borrowed[i] is None:
                        continue
                    # One check of the destination against the kind, before any byte moves, whether the page
                    # would come from staging or from the slab.
                    where, refused = (_destination(st, targets[i]) if layout is None
                                      else (None, layout_refused) if layout_refused
                                      else _page_index(layout, targets[i]))
                    if refused is None:
                        jobs.append((i, where))
                    else:
                        self.c.reload_bad_dst += 1
                        self._warn_once("bad_dst", "L3 reload: destination refused (%s); the page is a miss", refused)

                def run(job):
                    i, where = job
                    try:
                        if borrowed[i] is not None:
                            return _copy_staged(st, borrowed[i], where, layout)
                        if layout is None:
                            return self.read_into(st, hashes[i], entries[i], where)
                        return self.read_into_layout(st, hashes[i], entries[i], layout, where)
                    except Exception:  # EIO on read, ... -> miss
                        return False, ReloadMiss.ERROR

                # Run.
                results = self.run_all(run, jobs)
            finally:
                self._staged.give_back(borrowed)
            self._account(st, kind, n, jobs, results, borrowed, ikeys, entries, out)
        except Exception:
            log.exception("L3 reload failed; pages are misses")
            self.c.data_path_errors += 1
        return out

    def _account(self, st: KindState, kind, n, jobs, results, borrowed, ikeys, entries, out) -> None:
        """Counters, LRU touches of what was read, and the reclaim of entries whose bytes are not their page."""
        ts = now_us()
        touched, bad = [], []
        for (i, _), (ok, why) in zip(jobs, results):
            if ok and borrowed[i] is not None:
                out[i] = True
                self.c.reload_from_staging += 1
            elif ok:
                out[i] = True
                touched.append((ikeys[i], Touch(entries[i], ts)))
            elif why is ReloadMiss.ERROR:
                self.c.data_path_errors += 1
                if entries[i] is not None:
                    self.c.read_error(entries[i].disk)  # which drive failed it (stats()["per_disk"])
            elif why is ReloadMiss.BAD_DST:
                self.c.reload_bad_dst += 1
            elif blames_entry(why):
                # The entry points at bytes that are not this page: reclaim it (conditionally) via the writer.
                self.c.verify_failures += 1
                bad.append((ikeys[i], entries[i]))
        hits = sum(out)
        self.c.reload_hits += hits
        self.c.reload_misses += n - hits
        self.c.reload_bytes += hits * st.page_bytes
        self._note_reloads(kind, touched, bad)

    # ------------------------------------------------------------------ reads
    def run_all(self, fn, jobs: list) -> list:
        """``[fn(job) for job in jobs]``, spread over the read pool in ``reload_threads`` interleaved runs (one task
        per run, the caller's thread taking the first), not one task per page: a page-sized task paid a future, a
        queue hand-off and a thread wake-up each, which at 1 MiB pages cost about a third of the read's CPU."""
        t = min(self.config.reload_threads, len(jobs))
        if t <= 1:
            return [fn(job) for job in jobs]
        out: list = [None] * len(jobs)

        def run(k: int) -> None:
            for i in range(k, len(jobs), t):
                out[i] = fn(jobs[i])

        futures = [self.pool.submit(run, k) for k in range(1, t)]
        run(0)
        for f in futures:
            f.result()
        return out

    def read_into(self, st: KindState, content_hash: bytes, e: IndexEntry, dst) -> "tuple[bool, object]":
        """Read the page ``e`` names into ``dst[:page_bytes]`` (a writable flat byte array the caller checked) and
        verify it there. (True, OK) or (False, why: a ``BlobCheck`` or ``ReloadMiss``). OSError propagates: the
        caller counts it, the entry is not blamed."""
        rd = self._reader(st, e)
        if rd is None:
            return False, ReloadMiss.NO_SLAB
        spans = PageSpans.flat(byte_view(dst), st.page_bytes)
        plan = plan_read(spans.lengths, (spans.bases[0] % rd.align.mem,), st.slot_bytes, rd.align, True)
        return self._read(rd, st, content_hash, e, spans, plan)

    def read_into_layout(self, st: KindState, content_hash: bytes, e: IndexEntry, layout: PageLayout,
                         page_index: int) -> "tuple[bool, object]":
        """Like :meth:`read_into`, into page ``page_index`` of a host layout (each slice where it lives)."""
        if layout.page_bytes != st.page_bytes:
            return False, ReloadMiss.BAD_DST
        rd = self._reader(st, e)
        if rd is None:
            return False, ReloadMiss.NO_SLAB
        spans = layout.page_spans(page_index)
        plan = layout.read_plan(page_index, st.slot_bytes, rd.align, self.vectored or len(spans.lengths) == 1)
        return self._read(rd, st, content_hash, e, spans, plan)

    def _read(self, rd: SlabReader, st: KindState, content_hash: bytes, e: IndexEntry, spans: PageSpans,
              plan) -> "tuple[bool, object]":
        try:
            trailer, pieces = rd.read_spans(e.slot, spans, plan, self._bounce(plan.bounce_bytes))
        except ShortRead:
            return False, ReloadMiss.SHORT_READ
        header, why = parse_header_reason(trailer)
        if header is None:
            if why in (BlobCheck.EMPTY, BlobCheck.BAD_MAGIC) and is_old_header(spans.head(HEADER_SIZE)):
                why = BlobCheck.OLD_VERSION  # a v1 blob: its header landed where the v2 payload starts
            return False, why
        why = check_header(header, kind=st.kind, content_hash=content_hash, ns_digest=self.namespace,
                           payload_len=st.page_bytes, slot_bytes=st.slot_bytes)
        if why is not BlobCheck.OK:
            return False, why
        if checksum_views(pieces) != header.payload_checksum:
            return False, BlobCheck.PAYLOAD_CHECKSUM
        return True, BlobCheck.OK

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

    def alignment(self) -> dict:
        """What each open reader's file system reported for direct I/O (diagnostics, bench)."""
        with self._lock:
            return {f"rank{r}/disk{d}/{k.label}": str(rd.align) for (r, d, k), rd in self._readers.items()}

    def shutdown(self) -> None:
        self.pool.shutdown(wait=True)

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
