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

Pages of one call in adjacent slots of one slab come off the disk together (issue 28): :meth:`Reloader.units` groups
them, in slot order, into units of up to ``read_coalesce_bytes``, cut to equal shares for the readers (each takes
the next unit whenever it is free), and :meth:`Reloader.land_run` reads a unit in one transfer (each page's spans and
its own pad and header, nothing else: ``SlabReader.read_run``), then checks each page as if it were read alone. A
unit whose transfer fails or whose pages cannot share one plan is read page by page.

Reads never wait on a checksum (issue 28): :meth:`Reloader.run_all` keeps ``reload_threads`` reads in flight on
the read pool. With fewer than :data:`HAND_OFF_BELOW` readers each hands its landed page (views of the destination's
own bytes and the checksum its header promises) to a queue and issues its next read at once; the caller's thread
hashes from the first landed page on, helped by up to :func:`hash_helpers` pool threads when pages queue up and by
each reader once it is out of reads. With more readers each hashes its own page after its read: the others keep
the disk busy meanwhile, and the hand-off would only cost CPU. A page is a hit only once its checksum matched, and
the call returns only after every read and every checksum of the batch has finished. Two pages of one call with the
same destination are refused (the second is a ``bad_dst`` miss): one read could otherwise land over another's
verified bytes.

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
import collections
import logging
import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping, NamedTuple, Sequence

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

__all__ = ["Reloader", "blames_entry", "content_hashes", "layout_mismatch"]

# Layer-first pages: one vectored O_DIRECT read into each layer's chunk (True) or one transfer of the whole slot
# into a bounce buffer and one copy into the chunks (False: the fork's choice, seed 487-497). The config picks
# (``queues.layer_first_reads``, default "vectored"). Measured side by side with `sglang-glm-ext l3 bench`
# (docs_internal/l3_design.md, "Direct reads and restarts, measured" and issue 28): vectored costs the least CPU
# (dev VM: GLM-5 pages 0.22 vs 0.36 CPU s/GB, 1 MiB 0.32 vs 0.40); on the GPU machine's virtio disk a transfer into
# 64-78 scattered chunks is 0.85-0.89x as fast as one contiguous transfer (benchmark/l3_reload_cpu.py: a bare
# single transfer + copy + one-shot xxh3 gets 0.93x, at ~1.5x the CPU). The store's single mode, which then hashed
# the 64-78 chunks after the copy, was no faster than its vectored read there (1 MiB 1.41 vs 1.54 GB/s) at 1.5x the
# CPU; it now checks the slot in the bounce buffer in one call (GIL released) and copies only a page that matched
# (slab_reader.read_spans, verify_first): dev VM 2.0-2.1x -> 1.7x the CPU of raw read + xxh3.

# Layer-first pages are hashed chunk by chunk with xxhash's update(), which python-xxhash runs holding the GIL for
# pieces of 64 KiB or less (XXHASH_GIL_MINSIZE in its _xxhash.c): GLM-5's 41,984 B and a 1 MiB page's 16 KiB chunks,
# so while a layer-first page is checked, a reader whose read completed waits for the GIL to issue its next one.
# The alternative, ctypes calls into the same library (XXH3_64bits_update_dispatch per chunk: the GIL released for
# each call, ~1 us of call overhead), was measured against it on the store's own reload path, same pages,
# interleaved (benchmark/l3_layer_first_gil.py, 1 GB, 2-core dev VM at load 9-14, median (min-max) of 3 rounds):
#   1 MiB pages, 4 readers:   update() 1.01 (0.92-1.07) GB/s, 0.296 CPU s/GB; ctypes 0.89 (0.88-1.04), 0.427;
#                             page-first (one-shot, GIL released) 0.95 (0.89-1.06), 0.218
#   1 MiB pages, 16 readers:  update() 1.13 (0.97-1.22), 0.266; ctypes 1.07 (0.97-1.13), 0.443; page-first 1.09
#   GLM-5 pages, 4 readers:   update() 1.42 (1.38-1.55), 0.201; ctypes 1.24 (1.20-1.49), 0.257; page-first 1.60
# Releasing the GIL bought no throughput and cost 1.3-1.7x the CPU (a per-chunk address lookup included), so
# layer-first pages keep update(). The GPU machine's 16 cores are where a GIL stall would show first:
# scripts/gpu/l3_limit_ab.sh runs the same comparison there.

# Misses that say nothing against the index entry: the slab is not there (yet), or the blob is of a format version
# this build does not know (a newer server's page during a rolling upgrade: not ours to reclaim).
_NOT_BLAMED = frozenset({ReloadMiss.NO_SLAB, ReloadMiss.BAD_DST, ReloadMiss.ERROR, BlobCheck.UNKNOWN_VERSION})


# Below this many readers each reader hands its landed page to the caller's thread (and helpers) to hash, and goes on
# reading; from it on each reader hashes its own page right after its read. Measured on the GPU machine's disk
# (docs_internal/l3_design.md, issue 28): with one reader the hand-off lifts the reload from 0.70x to 0.86x of fio's
# best read (read and hash no longer take turns); with 8 (or 64) readers the disk is kept busy by the others while
# one hashes, GB/s is the same either way, and the hand-off (a queue put/get and a wake-up per page) costs 5-30 %
# more CPU per GB (layer-first 1 MiB pages: 1.34x -> 1.57x of raw read + xxh3).
HAND_OFF_BELOW = 4


# A layer-first page's checksum holds the GIL (chunks of 64 KiB or less, above), and a reader hashes a run's pages back
# to back, so another thread of the process (SGLang's scheduler) waits for a run's checksums or the 5 ms switch
# interval. queues.layer_first_gil_pause (config.py) lets the checksum give the GIL up (time.sleep(0)) at each page's
# end ("page") or also every that many bytes (format.checksum_views); off by default. Each pause is a GIL hand-off
# (two context switches), 10-45 us of CPU. Measured (benchmark/l3_gil_wait.py: a 0.5 ms sleeper's p99 overshoot while
# 8 readers reload; the bench's --gil-pause; l3_design.md, issue 28, run 13): GPU machine, against "off" in the same
# rounds, p99 / CPU per GB: "page" 1 MiB 1.52 -> 0.73 ms at 1.14x, GLM-5 1.42 -> 0.82 ms at 1.08x; "1MiB" 0.55 ms at
# 1.06x, 0.42 ms at 1.17x; 256 KiB 0.98 ms at 1.20x, 0.29 ms at 1.23x (the bench's A/B: layer-first CPU / (raw read +
# xxh3) 0.97 -> 1.16x and 1.06 -> 1.25x). Dev VM, the bench, "page": 1.05-1.12x -> 1.18-1.40x. The pause buys the
# scheduler's latency with the reload's CPU, over the 1.2x target, so it is the operator's choice.
# Page-first pages are hashed in one call that releases the GIL itself: never a pause.


def hash_helpers(reload_threads: int) -> int:
    """Pool threads that may help the caller hash when landed pages queue up: one per four reads in flight. One
    core hashes 5-12 GB/s cold (docs_internal/l3_design.md, issue 28), so a reload that keeps more reads in flight
    than one core can check gets more checking cores, and a small one adds none."""
    return max(1, reload_threads // 4)


class _Landed(NamedTuple):
    """Stage 1's hand-off to a hasher: the page's own bytes where they landed (views of the destination, never of
    a bounce buffer its reader reuses) and the payload checksum its header promises."""
    pieces: list
    want: int


def _verified(r, gil_pause: int = 0) -> "tuple[bool, object]":
    """Stage 2 (or a stage-1 outcome as is): True only once the checksum over the landed bytes matched.
    ``gil_pause``: config.layer_first_gil_pause_bytes (checksum_views' ``gil_pause_bytes``)."""
    if not isinstance(r, _Landed):
        return r
    try:
        ok = checksum_views(r.pieces, gil_pause_bytes=gil_pause) == r.want
    except Exception:  # noqa: BLE001 - a checksum that cannot run is a miss, never a crash
        return False, ReloadMiss.ERROR
    return (True, BlobCheck.OK) if ok else (False, BlobCheck.PAYLOAD_CHECKSUM)


def _stage1(fn, jobs: list) -> list:
    try:
        return fn(jobs)
    except Exception:  # noqa: BLE001 - ``fn`` maps its own errors; anything else costs only this unit's pages
        return [(False, ReloadMiss.ERROR)] * len(jobs)


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
                taken = _Taken(st.page_bytes)
                for i in range(n):
                    if entries[i] is None and borrowed[i] is None:
                        continue
                    # One check of the destination against the kind, before any byte moves, whether the page
                    # would come from staging or from the slab.
                    where, refused = (_destination(st, targets[i]) if layout is None
                                      else (None, layout_refused) if layout_refused
                                      else _page_index(layout, targets[i]))
                    if refused is None:
                        refused = taken.claim(where)
                    if refused is None:
                        jobs.append((i, where))
                    else:
                        self.c.reload_bad_dst += 1
                        self._warn_once("bad_dst", "L3 reload: destination refused (%s); the page is a miss", refused)

                def one(job):
                    i, where = job
                    try:
                        if borrowed[i] is not None:
                            return _copy_staged(st, borrowed[i], where, layout)
                        if layout is None:
                            return self.land_into(st, hashes[i], entries[i], where)
                        return self.land_into_layout(st, hashes[i], entries[i], layout, where)
                    except Exception:  # EIO on read, ... -> miss
                        return False, ReloadMiss.ERROR

                def run(unit):
                    if len(unit) == 1:
                        return [one(unit[0])]
                    return self.land_run(st, [(hashes[i], entries[i], where) for i, where in unit], layout, one, unit)

                # Run.
                results = self.run_all(run, jobs, self.units(st, jobs, entries, borrowed))
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
    def run_all(self, fn, jobs: list, units: "list[list[int]] | None" = None) -> list:
        """``[verified(r) for r in fn(...)]`` over ``jobs``, read unit by unit: ``units`` lists job positions (a page,
        or pages of adjacent slots read in one transfer; default: a unit a job), and ``fn`` takes one unit's jobs and
        returns one result per job. Each unit's read runs on the read pool, ``reload_threads`` in flight (one task per
        reader, which takes the next unit in ``units``' order whenever it is free: a task per page paid a future and a
        wake-up each, and a fixed share per reader left the call waiting on its slowest reader), each page's checksum
        on the caller's thread (helped as the module docstring says). A result is a final ``(ok, why)`` (a miss before
        the payload, a staged copy) or a :class:`_Landed` page, which is a hit only once its checksum matched. Returns
        when every read and checksum has finished: no thread of this call touches a destination or a result after
        that. Invariant: no pool task ever waits on another task (readers wait on their reads, helpers never block),
        so calls running at the same time cannot deadlock the pools."""
        n = len(jobs)
        if units is None:
            units = [[j] for j in range(n)]
        out: list = [None] * n

        def read(unit: list) -> list:
            rs = _stage1(fn, [jobs[j] for j in unit])
            return rs if len(rs) == len(unit) else [(False, ReloadMiss.ERROR)] * len(unit)

        pause = self.config.layer_first_gil_pause_bytes
        if len(units) <= 1:  # nothing to overlap
            for u in units:
                for j, r in zip(u, read(u)):
                    out[j] = _verified(r, pause)
            return out
        readers = min(self.config.reload_threads, len(units))
        hash_here = self.config.reload_threads >= HAND_OFF_BELOW
        landed: "queue.SimpleQueue" = queue.SimpleQueue()
        lock = threading.Lock()
        left = [n]  # results not final yet
        helping = [0]  # helper tasks of this call running now

        def final(i: int, result) -> None:
            out[i] = result
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                landed.put(None)  # wakes the caller: every result is final

        def drain() -> None:
            """Hash what has landed; never wait (a pool thread that waited could hold a reader's worker)."""
            while True:
                try:
                    item = landed.get_nowait()
                except queue.Empty:
                    return
                if item is None:
                    landed.put(None)  # the caller's wake-up: leave it for the caller
                    return
                final(item[0], _verified(item[1], pause))

        def helper() -> None:
            try:
                drain()
            finally:
                with lock:
                    helping[0] -= 1

        todo = collections.deque(units)  # popleft() is atomic: each unit is read exactly once

        def reader() -> None:
            while True:
                try:
                    u = todo.popleft()
                except IndexError:
                    break
                for i, r in zip(u, read(u)):
                    if not isinstance(r, _Landed):
                        final(i, r)
                        continue
                    if hash_here:  # enough readers: the others keep the disk busy while this one hashes
                        final(i, _verified(r, pause))
                        continue
                    landed.put((i, r))
                    if landed.qsize() > 1 and helping[0] < self.helpers:
                        with lock:
                            spawn = helping[0] < self.helpers
                            helping[0] += spawn
                        if spawn:
                            try:
                                self.hash_pool.submit(helper)
                            except RuntimeError:  # shut down: the caller hashes alone
                                with lock:
                                    helping[0] -= 1
            drain()  # out of reads: help hash the tail

        futures = []
        for _ in range(readers):
            try:
                futures.append(self.pool.submit(reader))
            except RuntimeError:  # the pool is shut down (store closing): read on this thread
                reader()
        while (item := landed.get()) is not None:
            final(item[0], _verified(item[1], pause))
        for f in futures:
            f.result()  # the readers' last step is a drain that finds nothing: quick
        return out

    def units(self, st: KindState, jobs: list, entries: list, borrowed: list) -> "list[list[int]]":
        """The call's reads (positions in ``jobs``), in the order the readers take them: pages in adjacent slots of
        one slab, in slot order, are one unit of up to ``read_coalesce_bytes`` (one transfer: :meth:`land_run`);
        every other page (staged, or alone) a unit of its own.

        Units are cut to equal shares. With R readers (``reload_threads``, at most one a page) each gets at least two
        units (a read in flight while the unit before it is hashed, also with one reader), and a run of adjacent
        slots is split into near-equal pieces of at most n / (R * m) pages, m = the units a reader needs at the byte
        cap: 128 pages at the 8 MiB cap of 1 MiB pages are 24 units of 5-6 pages, 16 pages a reader (runs of 7 were
        19 units dealt round-robin: 21 pages to two readers, 14 to the others, while the call waits for its last).
        Largest first (then slot order), staged pages last: readers take the next unit whenever they are free
        (:meth:`run_all`), so a slow read (a slow drive) holds back only its own unit, and the units left for the end
        are the short ones. On the GPU machine's disk the reload's GB/s did not move beyond its swing either way
        (docs_internal/l3_design.md, issue 28, run 11)."""
        n_slab = sum(1 for i, _ in jobs if borrowed[i] is None)
        readers = max(1, min(self.config.reload_threads, n_slab))
        cap = self.config.read_coalesce_bytes // st.slot_bytes
        slices = readers * max(2, -(-n_slab // (readers * max(cap, 1))))  # units at the cap, two a reader at least
        single = cap < 2 or n_slab < 2 * slices  # a unit would be one page
        staged: list[list[int]] = []
        slab = []
        for j, (i, _) in enumerate(jobs):
            if borrowed[i] is not None:
                staged.append([j])
            else:
                e = entries[i]
                slab.append((e.rank, e.disk, e.slot, j))
        if single:
            return [[j] for *_, j in sorted(slab)] + staged
        slab.sort()
        runs: list[list[int]] = []
        prev = None
        for r, d, slot, j in slab:
            if runs and prev == (r, d, slot - 1):
                runs[-1].append(j)
            else:
                runs.append([j])
            prev = (r, d, slot)
        out: list[list[int]] = []
        for run in runs:
            k = -(-len(run) * slices // n_slab)  # near-equal pieces of <= n_slab / slices (<= cap) pages
            base, extra = divmod(len(run), k)
            at = 0
            for q in range(k):
                size = base + (q < extra)
                out.append(run[at:at + size])
                at += size
        out.sort(key=len, reverse=True)  # stable: equal sizes stay in slot order
        return out + staged

    def read_into(self, st: KindState, content_hash: bytes, e: IndexEntry, dst) -> "tuple[bool, object]":
        """Read the page ``e`` names into ``dst[:page_bytes]`` (a writable flat byte array the caller checked) and
        verify it there. (True, OK) or (False, why: a ``BlobCheck`` or ``ReloadMiss``). OSError propagates: the
        caller counts it, the entry is not blamed."""
        return _verified(self.land_into(st, content_hash, e, dst), self.config.layer_first_gil_pause_bytes)

    def read_into_layout(self, st: KindState, content_hash: bytes, e: IndexEntry, layout: PageLayout,
                         page_index: int) -> "tuple[bool, object]":
        """Like :meth:`read_into`, into page ``page_index`` of a host layout (each slice where it lives)."""
        return _verified(self.land_into_layout(st, content_hash, e, layout, page_index),
                         self.config.layer_first_gil_pause_bytes)

    def land_into(self, st: KindState, content_hash: bytes, e: IndexEntry, dst) -> "_Landed | tuple[bool, object]":
        """Stage 1 of :meth:`read_into`: the read and the header check; the payload checksum is left to the
        caller (a :class:`_Landed`), or a miss with its reason."""
        rd = self._reader(st, e)
        if rd is None:
            return False, ReloadMiss.NO_SLAB
        spans = PageSpans.flat(byte_view(dst), st.page_bytes)
        plan = plan_read(spans.lengths, (spans.bases[0] % rd.align.mem,), st.slot_bytes, rd.align, True)
        return self._read(rd, st, content_hash, e, spans, plan)

    def land_into_layout(self, st: KindState, content_hash: bytes, e: IndexEntry, layout: PageLayout,
                         page_index: int) -> "_Landed | tuple[bool, object]":
        """Stage 1 of :meth:`read_into_layout` (see :meth:`land_into`)."""
        if layout.page_bytes != st.page_bytes:
            return False, ReloadMiss.BAD_DST
        rd = self._reader(st, e)
        if rd is None:
            return False, ReloadMiss.NO_SLAB
        spans = layout.page_spans(page_index)
        plan = layout.read_plan(page_index, st.slot_bytes, rd.align, self.vectored or len(spans.lengths) == 1)
        return self._read(rd, st, content_hash, e, spans, plan)

    def _read(self, rd: SlabReader, st: KindState, content_hash: bytes, e: IndexEntry, spans: PageSpans,
              plan) -> "_Landed | tuple[bool, object]":
        try:
            # A single transfer (layer_first_reads = "single") is checked in the bounce buffer, in one call, and
            # copied out only once it matched (read_spans' verify_first); every other read lands in place.
            bounce = self._bounce(plan.bounce_bytes)
            trailer, pieces, pending = (rd.read_spans(e.slot, spans, plan, bounce) if self.vectored
                                        else rd.read_spans(e.slot, spans, plan, bounce, verify_first=True))
        except ShortRead:
            return False, ReloadMiss.SHORT_READ
        return self._landed(rd, st, content_hash, spans, trailer, pieces, pending)

    def _landed(self, rd: SlabReader, st: KindState, content_hash: bytes, spans: PageSpans, trailer: bytes,
                pieces: list, pending) -> "_Landed | tuple[bool, object]":
        """A read page's header checked against the page asked for: a miss with its reason, or the page's
        :class:`_Landed` (its payload checksum still to run); a verify-first page (``pending``) is checked and
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
        return _Landed(pieces, header.payload_checksum)

    def land_run(self, st: KindState, pages: list, layout: "PageLayout | None", one, jobs: list) -> list:
        """Stage 1 of a unit of pages in adjacent slots (:meth:`units`): ``pages`` is ``[(content_hash, entry,
        destination)]`` in slot order, read in as few transfers as the kernel's iovec limit allows
        (:meth:`SlabReader.read_run`), each page then checked like a page read alone. Where the pages cannot share
        one plan (a destination off the others' alignment, a layout whose spans are not all direct), the transfer
        fails (EIO, the file ends) or the kernel refuses it, each page is read alone (``one(jobs[q])``): an error
        costs only the page it is in."""
        rd = self._reader(st, pages[0][1])
        if rd is None:
            return [(False, ReloadMiss.NO_SLAB)] * len(pages)
        first = pages[0][1].slot
        spans_all, plan = [], None
        for q, (_, e, where) in enumerate(pages):
            if layout is None:
                spans = PageSpans.flat(byte_view(where), st.page_bytes)
                p = plan_read(spans.lengths, (spans.bases[0] % rd.align.mem,), st.slot_bytes, rd.align, True)
            else:
                spans = layout.page_spans(where)
                p = layout.read_plan(where, st.slot_bytes, rd.align, self.vectored or len(spans.lengths) == 1)
            if p.tail is None or (plan is not None and p is not plan and p != plan) or e.slot != first + q:
                return [one(job) for job in jobs]
            plan = p
            spans_all.append(spans)
        mem = rd.align.mem
        stride = -(-plan.bounce_bytes // mem) * mem
        try:
            got = rd.read_run(first, spans_all, plan, self._bounce((len(pages) - 1) * stride + plan.bounce_bytes),
                              stride)
        except Exception:  # noqa: BLE001 - EIO, the file ends, ...: each page alone says which
            got = None
        if got is None:
            return [one(job) for job in jobs]
        out = []
        for (h, _, _), spans, (trailer, pieces) in zip(pages, spans_all, got):
            try:
                out.append(self._landed(rd, st, h, spans, trailer, pieces, None))
            except Exception:  # noqa: BLE001 - as for a page read alone
                out.append((False, ReloadMiss.ERROR))
        return out

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
