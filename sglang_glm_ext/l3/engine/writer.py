"""The writer thread: the only owner of every slot pool and page LRU of a store (no lock on either).

Each round it applies committed batches (``Committer`` results), runs control operations (free, clear, flush
barriers) and reload outcomes (touches, verify failures), one bounded GC round, then takes a batch of staged pages:
allocates a slot per page (reclaiming on a full pool), seals the blob (header + xxh3, GIL released) and hands the
O_DIRECT writes to a small I/O pool; the committer makes the batch durable while the next one is sealed. Touches
reach the shared index at most once a second (coalesced, max-only), so other ranks' GC sees them.

``free``, ``clear``, ``add_kind`` and ``flush`` barriers first wait for every commit in flight, so no commit of an older spill
can land after them. Every control operation is acknowledged, also when it fails: ``flush`` waits for the count
and ``clear`` for its :class:`~.messages.Completion`, so one failure never makes later ones time out.

Several disks per rank (``ranks.mapping`` entry ``[0, 1, ...]``): each disk has its own I/O pool and its own
committer (its own fdatasync and index commit per batch), so a slow drive's writes or fdatasync never hold another
drive's batches. A round takes up to ``write_batch_pages`` pages per disk and places each new page on the disk its
key picks (``KindDisks.preferred``), stepping to the next disk in ring order when that one cannot take it this
round: its slab writes are failing (``Health.slab_on``; it gets one probe page every :data:`_PROBE_S` so its
recovery is noticed), its committer already holds a full backlog (a slow drive), or its pool has no slot even
after a GC reclaim. So a slow or failing drive sheds new pages to the others and costs only the pages it holds
(and, while it fails, the few it is probed with). When every working drive is backed up, the round waits until one
of them finishes a batch (backpressure, as on one disk, but never on a stalled drive while another drains); when no
drive works, a page goes where its key says and its write fails there, counted, as on one failing disk.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Mapping

from ..disk.aligned import AlignedBuffer
from .committer import QUEUE_MAX, Committer
from ..config import L3Config
from .counters import Counters
from ..disk.format import PayloadKind, seal_blob
from .health import Health
from . import latency
from .index import IndexEntry, KeySpace, L3Index
from .kinds import KindDisks, KindState
from .messages import (AddKind, Barrier, ClearRank, ControlOp, Failure, FreePages, PendingWrite, StagedPage, Touch, WriteOutcome, WriteResult, failure)
from .reclaim import Collector
from .staging import StagedPages

__all__ = ["Writer"]

log = logging.getLogger(__name__)

_TOUCH_PERSIST_INTERVAL_S = 1.0  # reload touches reach the shared index at most this often (coalesced)
_MAX_BATCH_WAIT_S = 0.002  # the writer waits this long for a batch to fill before writing what it has
_READER_CHECK_INTERVAL_S = 30.0  # the writer clears dead processes' LMDB reader slots at most this often
_PROBE_S = 1.0  # a disk whose slab writes fail gets one new page this often (is it back?); the rest go elsewhere
# Batches a disk's committer holds at most without blocking the writer (a group committing, the next group in its
# queue: committer.py): a disk that has them all gets no new page in a round (a slow drive sheds its pages to the
# others).
_BACKLOG = QUEUE_MAX + 1


def _write_slot(slab, slot: int, buf: AlignedBuffer) -> "Failure | None":
    """I/O-pool task: write one sealed slot. Returns None, or the failure as plain data (see ``Failure``); the
    exception and its traceback die with this frame."""
    try:
        slab.write_slot(slot, buf)
        return None
    except Exception as e:
        return failure(e)


class Writer:
    """The caller-side methods (``post``, ``note_reloads``, ``flush``, ``stop``) may be called from any thread;
    everything else runs on the writer thread. The hand-off state is guarded by ``staged.cond``."""

    def __init__(self, config: L3Config, *, rank: int, keys: KeySpace, index: L3Index,
                 kinds: Mapping[PayloadKind, KindDisks], staged: StagedPages, counters: Counters):
        self.config = config
        self.rank = rank
        self.disks = config.disks_for_rank(rank)
        self.keys = keys
        self.index = index
        self.kinds = kinds
        self.staged = staged
        self.c = counters
        self.cond = staged.cond
        # hand-off state (under cond)
        self._ctl: collections.deque[ControlOp] = collections.deque()
        self.ctl_posted = 0
        self.ctl_done = 0
        # Reload outcomes, one slot per page (latest wins): (kind, key) -> Touch / the entry that failed to verify.
        self._touch_in: dict[tuple[PayloadKind, bytes], Touch] = {}
        self._bad_in: dict[tuple[PayloadKind, bytes], IndexEntry] = {}
        self._completed: collections.deque[list[WriteResult]] = collections.deque()
        self._commits_inflight = 0
        self._stop = False
        # writer thread only
        self._touch_pending: dict[bytes, int] = {}
        self._touch_flushed_at = time.monotonic()
        self._reader_checked_at = time.monotonic()
        # writer thread only: every failure counted, logged once per change of state (a slab path per disk)
        self.health = Health(rank, disks=self.disks)
        self.reclaim = Collector(config, index, kinds, rank=rank, namespace=keys.namespace,
                                 counters=counters, health=self.health)
        # Per disk: its own I/O threads and committer, so one drive's slow writes or fdatasync hold only its pages.
        several = len(self.disks) > 1
        self._io = {d: ThreadPoolExecutor(config.io_threads,
                                          thread_name_prefix=f"l3-io-r{rank}" + (f"d{d}" if several else ""))
                    for d in self.disks}
        self._committers = {d: Committer(index, rank=rank, disk=d, deliver=self._committed,
                                         name=f"l3-commit-r{rank}" + (f"d{d}" if several else ""))
                            for d in self.disks}
        self._backlog = {d: 0 for d in self.disks}  # batches submitted to each disk's committer, not yet applied
        self._probed_at = {d: 0.0 for d in self.disks}
        self.disk_write_errors = {d: 0 for d in self.disks}  # pages whose write or fdatasync failed, per disk
        self.disk_shed = {d: 0 for d in self.disks}  # new pages their key placed on a disk that could not take them
        self._thread = threading.Thread(target=self._main, name=f"l3-writer-r{rank}", daemon=True)

    @property
    def batch_pages(self) -> int:
        """Pages one round takes: a batch per disk."""
        return self.config.write_batch_pages * len(self.disks)

    def start(self) -> None:
        for c in self._committers.values():
            c.start()
        self._thread.start()

    # ------------------------------------------------------------------ any thread
    def post(self, op: ControlOp) -> None:
        with self.cond:
            self.ctl_posted += 1
            self._ctl.append(op)
            self.cond.notify()

    def note_reloads(self, kind: PayloadKind, touched: list[tuple[bytes, Touch]],
                     bad: list[tuple[bytes, IndexEntry]]) -> None:
        """Coalesced per page, not queued per hit: what waits for the writer is bounded by the pages there are,
        however many hits arrive while it is busy (a stalled disk), and the LRU gets one push per page per round."""
        with self.cond:
            for key, touch in touched:
                self._touch_in[(kind, key)] = touch
            for key, entry in bad:
                self._bad_in[(kind, key)] = entry
            self.cond.notify()

    def flush(self, timeout: "float | None") -> bool:
        """Wait until everything staged or posted before this call is finished, then pass a barrier: the writer
        completes every commit in flight, applies every reload outcome recorded before the barrier (verify-failure
        reclaims, touches, persisted at once) and runs GC back under its watermarks first. True if done in time
        (``L3Store.flush`` states the promise)."""
        deadline = None if timeout is None else time.monotonic() + timeout

        def wait_for(pred) -> bool:
            while not pred():
                if not self._thread.is_alive():
                    return False
                rem = None if deadline is None else deadline - time.monotonic()
                if rem is not None and rem <= 0:
                    return False
                self.cond.wait(min(rem, 1.0) if rem is not None else 1.0)
            return True

        with self.cond:
            target, ctl_target = self.staged.enqueued, self.ctl_posted
            if not wait_for(lambda: self.staged.done >= target and self.ctl_done >= ctl_target):
                return False
            self.ctl_posted += 1
            barrier = self.ctl_posted
            self._ctl.append(Barrier())
            self.cond.notify_all()
            return wait_for(lambda: self.ctl_done >= barrier)

    def stop(self, timeout: float) -> None:
        """Finish what is in flight, persist touches, stop both threads and the I/O pool."""
        with self.cond:
            self._stop = True
            self.cond.notify_all()
        self._thread.join(timeout)
        for io in self._io.values():
            io.shutdown(wait=True)

    def stats(self) -> dict:
        states = [st for grp in tuple(self.kinds.values()) for st in grp.parts]  # a kind may be added meanwhile
        return {
            "write_path_failing": self.health.failing(),  # "slab" / "index" while a full disk refuses them
            "control_queue_depth": len(self._ctl),
            "pending_touches": len(self._touch_in),
            "gc_heap_items": sum(len(st.lru.heap) for st in states),
        }

    def disk_stats(self) -> dict:
        """Per disk of this rank (``stats()["per_disk"]``): durable pages and slots of every kind on it, whether its
        slab writes are failing, pages whose write failed there and new pages it shed to the others."""
        out = {d: {"pages": 0, "slots_used": 0, "slots_total": 0, "write_failing": self.health.slab_on(d).failing,
                   "write_errors": self.disk_write_errors[d], "shed_pages": self.disk_shed[d],
                   "commit_backlog": self._backlog[d]} for d in self.disks}
        for grp in tuple(self.kinds.values()):
            for st in grp.parts:
                row = out[st.disk]
                row["pages"] += len(st.lru.current)
                row["slots_used"] += st.pool.used
                row["slots_total"] += st.pool.limit
        return out

    # ------------------------------------------------------------------ writer thread
    def _has_work(self) -> bool:
        return bool(self.staged.queue or self._ctl or self._stop or self._completed or self._touch_in
                    or self._bad_in or self.reclaim.gc_active())

    def _main(self) -> None:
        batch_max = self.batch_pages
        staged = self.staged
        while True:
            with self.cond:
                while not self._has_work():
                    timed = bool(self._touch_pending or self._commits_inflight)
                    timeout = 0.5 if timed else _READER_CHECK_INTERVAL_S
                    retry = self.reclaim.retry_in()  # GC paused by a refusing index: wake up to try again
                    if retry is not None:
                        timed, timeout = True, min(timeout, max(retry, 0.001))
                    self.cond.wait(timeout)
                    if timed:
                        break
                if self._stop and not staged.queue and not self._ctl and not self._commits_inflight:
                    break
                if staged.queue and len(staged.queue) < batch_max and not self._stop:
                    # Let a burst fill the batch: one fdatasync + one commit per batch, not per page.
                    self.cond.wait(_MAX_BATCH_WAIT_S)
                batch = staged.take(batch_max)
            try:
                self._apply_commits(block=False)
                self._drain_control()
                self.reclaim.round()
                if batch:
                    self._submit(batch)
                    batch = []
                self._maybe_persist_touches()
                self._maybe_reader_check()
            except Exception as e:  # the writer must outlive any single failure; logged once per episode
                self.health.writer.failed(failure(e), exc_info=not self.health.writer.failing)
                self.c.data_path_errors += 1
                with self.cond:
                    for page in batch:
                        staged.finish(page)
                    self.cond.notify_all()
        self._apply_commits(block=True)
        for c in self._committers.values():
            c.stop()
        self._maybe_persist_touches(force=True)

    # Pipeline: the writer allocates, seals and submits batch N+1 while the committer waits for batch N's writes,
    # fdatasyncs and commits its index entries; the writer then applies batch N's results.
    def _submit(self, batch: list[StagedPage]) -> None:
        pending: dict[int, list[PendingWrite]] = {}
        skipped: list[StagedPage] = []
        room = self._round_room() if len(self.disks) > 1 else None
        for page in batch:
            if page.cancelled:
                skipped.append(page)
                continue
            st, slot = self._place(self.kinds[page.kind], page.content_hash, room)
            if slot is None:
                self.c.dropped_pool_full += 1
                skipped.append(page)
                continue
            try:
                seal_blob(page.buf.view, kind=page.kind, content_hash=page.content_hash,
                          ns_digest=self.keys.namespace, payload_len=st.page_bytes)
                written = self._io[st.disk].submit(_write_slot, st.slab, slot, page.buf)
            except Exception as e:
                self._write_failed(st, slot, failure(e))
                skipped.append(page)
                continue
            pending.setdefault(st.disk, []).append(PendingWrite(page, st, slot, written))
        if skipped:
            with self.cond:
                for page in skipped:
                    self.staged.finish(page)
                self.cond.notify_all()
        for disk, writes in pending.items():
            with self.cond:
                self._commits_inflight += 1
                self._backlog[disk] += 1
            # Bounded: a slow disk stalls the writer, never the callers. With several disks a round places no page
            # on a disk whose backlog is full (_round_room), so this never waits for one drive while another could
            # take the pages.
            self._committers[disk].submit(writes)

    def _round_room(self) -> dict[int, "int | None"]:
        """New pages each disk may take this round: None (any), 1 (a failing disk's probe) or 0 (none: its slab
        writes fail and its probe is not due, or its committer holds a full backlog). When every disk that works
        is backed up, wait until one of them finishes a batch (backpressure, as on one disk -- but on whichever
        drive frees first, never on a stalled one while the others drain). When none works, nothing is left out:
        pages then go where their key says, and fail there (counted), as on one failing disk."""
        while True:
            now = time.monotonic()
            health = {d: (1 if now - self._probed_at[d] >= _PROBE_S else 0) if self.health.slab_on(d).failing
                      else None for d in self.disks}
            room = {d: 0 if self._backlog[d] >= _BACKLOG else r for d, r in health.items()}
            if any(r != 0 for r in room.values()) or all(r == 0 for r in health.values()):
                return room
            with self.cond:  # a commit delivered (or the 0.5 s tick: a probe may come due) ends the wait
                if not self._completed:
                    self.cond.wait(0.5)
            self._apply_commits(block=False)

    def _place(self, grp: KindDisks, content_hash: bytes, room: "dict[int, int | None] | None"
               ) -> "tuple[KindState, int | None]":
        """The disk and slot a new page is written to (module docstring). One disk: its pool, GC reclaiming the
        coldest pages when it is full. Several: the key's disk first, then the others in ring order, each only if
        it has room this round (``_round_room``); none has: the key's disk."""
        parts = grp.parts
        first = grp.preferred(content_hash)
        if room is None:
            order = [parts[first]]
        else:
            ring = [parts[(first + i) % len(parts)] for i in range(len(parts))]
            order = [st for st in ring if room[st.disk] != 0] or [parts[first]]
        for st in order:
            slot = st.pool.alloc()
            if slot is None and not self.reclaim.backing_off():
                self.reclaim.reclaim_coldest(st, self.config.gc_budget_per_round)
                slot = st.pool.alloc()
            if slot is not None:
                if room is not None:
                    if st is not parts[first]:
                        self.disk_shed[parts[first].disk] += 1
                    if room.get(st.disk) == 1:
                        room[st.disk] = 0  # the probe page is placed
                        self._probed_at[st.disk] = time.monotonic()
                return st, slot
        return order[0], None

    def _committed(self, results: list[WriteResult]) -> None:
        """Committer thread: hand a finished batch back."""
        with self.cond:
            self._completed.append(results)
            self.cond.notify_all()

    def _apply_commits(self, block: bool) -> None:
        """Apply committed batches to the pools / LRU. ``block`` waits for every batch in flight (a barrier before
        free / clear / stop, so no commit can land after them)."""
        while True:
            with self.cond:
                if block:
                    while self._commits_inflight and not self._completed:
                        self.cond.wait(1.0)
                if not self._completed:
                    return
                results = self._completed.popleft()
            committed = index_failed = None
            disk = results[0].state.disk if results else None
            for r in results:
                st = r.state
                if r.outcome is WriteOutcome.OK:
                    self.c.spilled += 1
                    self.c.spilled_bytes += st.page_bytes
                    latency.of(self.index).spill.since(r.page.staged_at)
                    st.lru.record(r.page.key, r.last_access, r.slot)
                    committed = True
                elif r.outcome is WriteOutcome.WRITE_ERROR:
                    self._write_failed(st, r.slot, r.failure)
                elif r.outcome is WriteOutcome.INDEX_ERROR:
                    # The file system refused the commit (a full disk) and no entry names the slot: it goes back.
                    self.c.write_errors += 1
                    st.pool.free(r.slot)
                    index_failed = r.failure
                elif r.outcome is WriteOutcome.ERROR:
                    # Unknown whether the index commit happened: keep the slot allocated (a leak until the next
                    # clear / load) rather than risk handing out a slot an entry may reference.
                    self.c.write_errors += 1
                    index_failed = r.failure
                else:
                    if r.outcome is WriteOutcome.DEDUP:  # someone stored the same page first: ours is unreferenced
                        self.c.dedup += 1
                    elif r.outcome is WriteOutcome.INDEX_FULL:
                        self.c.index_full += 1
                    else:
                        committed = committed or r.outcome is WriteOutcome.DEDUP
                    st.pool.free(r.slot)
            # One report per batch, not per page: the log hears of a change of state only (health.py).
            if index_failed is not None:
                self.health.index.failed(index_failed)
            elif committed:
                self.health.index.ok()
            if committed or index_failed is not None:
                self.health.slab_on(disk).ok()  # the batch's writes and fdatasync went through
            with self.cond:
                self._commits_inflight -= 1
                if disk in self._backlog:
                    self._backlog[disk] -= 1
                for r in results:
                    # durable: committed here, or the same page committed first (a dedup); what ack = "durable" waits for
                    r.page.durable = r.outcome is WriteOutcome.OK or r.outcome is WriteOutcome.DEDUP
                    self.staged.finish(r.page)
                self.cond.notify_all()

    def _write_failed(self, st: KindState, slot: int, err: "Failure | None") -> None:
        self.c.write_errors += 1
        self.disk_write_errors[st.disk] = self.disk_write_errors.get(st.disk, 0) + 1
        self._probed_at[st.disk] = time.monotonic()  # a failure is as good as a probe: the next one _PROBE_S on
        self.health.slab_on(st.disk).failed(f"{st.kind.label} slot {slot}: {err}")
        st.pool.free(slot)

    def _apply_reload_outcomes(self) -> None:
        """Apply what reloads recorded so far: verify failures reclaim exactly the entry the reader saw, hits bump
        the LRU and wait to be persisted (coalesced)."""
        with self.cond:
            touches, self._touch_in = self._touch_in, {}
            bads, self._bad_in = self._bad_in, {}
        for (kind, key), entry in bads.items():
            # exact: the reader saw this entry some time ago; only that very commit is known to be bad, never a
            # newer commit of the same page into the same slot.
            self.reclaim.reclaim(kind, [(key, entry)], exact=True)
        for (kind, key), (entry, ts) in touches.items():
            st = self.kinds[kind].on(entry.disk) if entry.rank == self.rank else None
            if st is not None:
                cur = st.lru.current.get(key)
                if cur is not None and cur[1] == entry.slot and ts > cur[0]:
                    st.lru.record(key, ts, entry.slot)
            # Persist for other ranks' GC (and for a later `load`), coalesced.
            self._touch_pending[key] = max(ts, self._touch_pending.get(key, 0))

    def _drain_control(self) -> None:
        self._apply_reload_outcomes()
        while self._ctl:
            op = self._ctl.popleft()
            ok = False
            try:
                self._apply_commits(block=True)  # barrier: no commit of an older spill lands after this op
                if isinstance(op, FreePages):
                    self.reclaim.free(op.kind, op.keys)
                elif isinstance(op, ClearRank):
                    ok = self._clear()
                elif isinstance(op, AddKind):
                    # Inserted on this thread: every iteration over the kinds here (GC, clear) sees a stable map.
                    self.kinds[op.state.kind] = op.state
                    ok = True
                else:
                    # flush's promise: every reload that returned before the call has taken effect (a reload
                    # recorded after this pass swapped the outcomes out is applied here), touches are persisted,
                    # GC is under its watermarks.
                    self._apply_reload_outcomes()
                    self._maybe_persist_touches(force=True)
                    self.reclaim.until_below_watermarks()
            except Exception as e:
                log.error("L3 %s failed: %s", op.name, failure(e))
                self.c.data_path_errors += 1
            finally:
                if isinstance(op, (ClearRank, AddKind)):
                    op.done.ok = ok
                    op.done.set()
                with self.cond:
                    if isinstance(op, FreePages):
                        self.staged.free_done(op.kind, op.hashes)
                    self.ctl_done += 1
                    self.cond.notify_all()

    def _clear(self) -> bool:
        """True if every entry of this (deployment, rank) is gone.

        The pools are reset only to what the index still references, whatever the index did: a delete that failed
        or stopped partway (map full after some chunks committed) leaves entries that point at this rank's slots;
        those slots stay allocated (and their pages present, in the LRU), so they are never handed out again while
        an entry names them."""
        with self.cond:
            self.staged.drop_queued()
            self.cond.notify_all()
        dep = self.keys.deployment
        ok = True
        try:
            self.index.delete_for(dep, self.rank)
        except Exception as e:
            log.error("L3 clear: index delete failed: %s", failure(e))
            self.c.data_path_errors += 1
            ok = False
        survivors = []
        if not ok:
            try:
                survivors = [(k, e) for k, e in self.index.scan(dep).items if e.rank == self.rank]
            except Exception as e:
                # What survived is unknown: keep every slot as it is (a leak until the next cold start) rather
                # than free a slot an entry may still name.
                log.error("L3 clear: cannot list surviving entries, keeping every slot: %s", failure(e))
                return False
        self.reclaim.keep_only(survivors)
        self._touch_pending.clear()
        return ok

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
            if not self.index.touch_many(items):  # refused (a full disk): recency is best effort, counted
                self.health.index.failed(self.index.last_refusal or "index map full")
        except Exception:
            self.c.data_path_errors += 1
