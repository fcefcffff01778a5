"""The pages accepted by ``spill`` and not yet finished: their staging buffers, the in-flight map, the write queue.

Ownership: callers admit and enqueue pages; the writer thread takes batches and finishes pages (durable,
deduplicated, dropped or failed), which releases their buffers. Everything here but the buffer pool is guarded by
:attr:`StagedPages.cond`, the one condition of the caller/writer hand-off: the writer sleeps on it until any hand-off
(this queue, its control queue, reload touches, committed batches) has work.

A staged page is visible to ``exists`` and served by ``reload`` until it is durable (what SGLang expects of a
backend: a page it just handed over is there at once): :meth:`StagedPages.borrow` takes a reader reference on a page
that is staged and not cancelled; :meth:`StagedPages.finish` never releases a buffer a reader holds (the page is
retired, and :meth:`StagedPages.give_back` of its last reader releases it). A page whose write fails is finished
like any other, so it leaves the in-flight map and stops being visible; a reader that copied it got its bytes.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Mapping

from ..disk.aligned import AlignedBuffer
from ..disk.format import PayloadKind
from .messages import Admission, StagedPage

__all__ = ["StagingPool", "StagedPages"]


class StagingPool:
    """Aligned slot-sized buffers, capped in total bytes. ``acquire`` never blocks: None means "full, drop"."""

    def __init__(self, cap_bytes: int, sizes: Mapping[PayloadKind, int]):
        self.cap = cap_bytes
        self.sizes = dict(sizes)
        self._free: dict[PayloadKind, list[AlignedBuffer]] = {k: [] for k in sizes}
        self._lock = threading.Lock()
        self.allocated = 0  # bytes of buffers that exist (in use or free); never exceeds cap
        self.in_use = 0
        self.peak_allocated = 0

    def add_kind(self, kind: PayloadKind, size: int) -> None:
        """Buffers of one more kind (``L3Store.add_kind``), under the same byte cap."""
        with self._lock:
            self.sizes.setdefault(kind, size)
            self._free.setdefault(kind, [])

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


class StagedPages:
    """In-flight pages of one store. Invariant: a page is in :attr:`queue` at most once, in the in-flight map
    until it is finished, and finished exactly once (its buffer released, ``done`` advanced)."""

    def __init__(self, pool: StagingPool, *, max_inflight: int, batch_pages: int):
        self.pool = pool
        self.cond = threading.Condition(threading.Lock())
        self.queue: collections.deque[StagedPage] = collections.deque()
        self._staged: dict[tuple[PayloadKind, bytes], StagedPage] = {}
        self._max_inflight = max_inflight
        self._batch_pages = batch_pages
        self.enqueued = 0  # pages ever queued (seq of the last one)
        self.done = 0  # pages ever finished
        # (kind, content hash) -> frees posted and not yet applied by the writer: the index entry such a page may
        # still have is about to be deleted, so it is neither a dedup for spill nor counted by exists.
        self.free_pending: dict[tuple[PayloadKind, bytes], int] = {}
        # Pages acknowledged (a write-behind spill answered True) and not yet finished: what a crash right now loses.
        self.acked_pages = 0
        self.acked_bytes = 0

    @property
    def inflight(self) -> int:
        return self.enqueued - self.done

    # ------------------------------------------------------------------ callers
    def admit(self, kind: PayloadKind, content_hash: bytes) -> Admission:
        """A page staged and not cancelled is a dedup. A cancelled copy (freed or cleared, maybe still being written)
        is no copy: the page is staged again, and its new copy replaces the old one in the map (:meth:`enqueue`)."""
        with self.cond:
            page = self._staged.get((kind, content_hash))
            if page is not None and not page.cancelled:
                return Admission.DEDUP
            if self.enqueued - self.done >= self._max_inflight:
                return Admission.FULL
        return Admission.STAGE

    def enqueue(self, kind: PayloadKind, content_hash: bytes, key: bytes, buf: AlignedBuffer, *,
                acked: bool = True, nbytes: int = 0) -> "StagedPage | None":
        """Queue a filled buffer; None (the buffer is released) if another spiller staged the page meanwhile (the
        caller finds that copy with :meth:`find`). ``acked``: the caller answers True for it now, before it is
        durable (write-behind). Wakes the writer once a batch is full, not per page: a per-page wake-up hands it
        partial batches (one fdatasync + commit each) under CPU load; the caller wakes it at the end of its call
        (:meth:`wake`)."""
        with self.cond:
            cur = self._staged.get((kind, content_hash))
            if cur is not None and not cur.cancelled:
                self.pool.release(kind, buf)
                return None
            if cur is not None:  # a cancelled copy in flight finishes on its own (finish() checks identity)
                del self._staged[(kind, content_hash)]
            self.enqueued += 1
            page = StagedPage(self.enqueued, kind, content_hash, key, buf, acked=acked, nbytes=nbytes,
                              staged_at=time.monotonic())
            if acked:
                self.acked_pages += 1
                self.acked_bytes += nbytes
            self._staged[(kind, content_hash)] = page
            self.queue.append(page)
            if len(self.queue) >= self._batch_pages:
                self.cond.notify()
        return page

    def _unack(self, page: StagedPage) -> None:
        """Under :attr:`cond`. The page no longer counts as acknowledged-not-durable (finished or cancelled)."""
        if page.acked:
            page.acked = False
            self.acked_pages -= 1
            self.acked_bytes -= page.nbytes

    def oldest_acked_age(self) -> float:
        """Seconds the oldest page acknowledged and not yet durable has waited (0.0: none). The in-flight map keeps
        staging order, so this looks at its head (past cancelled or unacknowledged pages only)."""
        with self.cond:
            if not self.acked_pages:
                return 0.0
            for page in self._staged.values():
                if page.acked:
                    return max(0.0, time.monotonic() - page.staged_at)
        return 0.0

    def wait_room(self, deadline: float) -> bool:
        """Wait (bounded) until the writer finishes something, which frees staging room and in-flight count: the
        backpressure a write-back of SGLang's backup thread gets instead of a dropped page. False at the deadline."""
        with self.cond:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            done = self.done
            self.cond.wait(min(left, 0.05))  # finish() notifies; the cap also covers a buffer a reader gives back
            return self.done != done or time.monotonic() < deadline

    def wait_finished(self, pages: "list[StagedPage]", deadline: float) -> None:
        """Wait (bounded) until every page is finished by the writer (``ack = "durable"``)."""
        with self.cond:
            while not all(p.finished for p in pages):
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self.cond.wait(min(left, 1.0))

    def wake(self) -> None:
        with self.cond:
            self.cond.notify()

    def find(self, kind: PayloadKind, content_hash: bytes) -> "StagedPage | None":
        """Under :attr:`cond`. The staged page, if any."""
        return self._staged.get((kind, content_hash))

    def visible(self, kind: PayloadKind, hashes: "list[bytes]") -> list[bool]:
        """Whether each page is staged and not cancelled (so a reload could still be served from staging)."""
        staged = self._staged
        with self.cond:
            out = []
            for h in hashes:
                page = staged.get((kind, h))
                out.append(page is not None and not page.cancelled and page.buf is not None)
            return out

    def borrow(self, kind: PayloadKind, hashes: "list[bytes | None]") -> "list[StagedPage | None]":
        """A reader reference on each page that is staged and not cancelled (None for the others). Every page
        returned must go back through :meth:`give_back`; until then its buffer is never released or reused."""
        staged = self._staged
        with self.cond:
            out: list[StagedPage | None] = []
            for h in hashes:
                page = staged.get((kind, h)) if h is not None else None
                if page is None or page.cancelled or page.buf is None:
                    out.append(None)
                    continue
                page.readers += 1
                out.append(page)
            return out

    def give_back(self, pages: "list[StagedPage | None]") -> None:
        """Drop the reader references :meth:`borrow` took; the last reader of a retired page releases its buffer."""
        with self.cond:
            for page in pages:
                if page is None:
                    continue
                page.readers -= 1
                if not page.readers and page.retired and page.buf is not None:
                    self.pool.release(page.kind, page.buf)
                    page.buf = None

    def note_free(self, kind: PayloadKind, hashes: "list[bytes]") -> None:
        """Under :attr:`cond`. ``free`` of these pages: a staged copy is cancelled, and each page counts as freed
        (not durable for spill's dedup, not present for exists) until the writer applied the free (:meth:`free_done`),
        whatever entry the index still holds meanwhile."""
        pending = self.free_pending
        for h in hashes:
            page = self._staged.get((kind, h))
            if page is not None:
                page.cancelled = True
                self._unack(page)
            pending[(kind, h)] = pending.get((kind, h), 0) + 1

    def free_done(self, kind: PayloadKind, hashes: "tuple[bytes, ...]") -> None:
        """Under :attr:`cond`. The writer applied (or failed) one free of these pages."""
        pending = self.free_pending
        for h in hashes:
            n = pending.get((kind, h), 0) - 1
            if n > 0:
                pending[(kind, h)] = n
            else:
                pending.pop((kind, h), None)

    def freed(self, kind: PayloadKind, hashes: "list[bytes]") -> "list[bool]":
        """Whether each page has a free the writer has not applied yet (cheap when there is none)."""
        if not self.free_pending:
            return [False] * len(hashes)
        with self.cond:
            pending = self.free_pending
            return [(kind, h) in pending for h in hashes]

    def cancel_all(self) -> None:
        """Under :attr:`cond`. Every staged page is cancelled (clear)."""
        for page in self._staged.values():
            page.cancelled = True
            self._unack(page)

    # ------------------------------------------------------------------ writer
    def drop_queued(self) -> None:
        """Under :attr:`cond`. Finish every queued page unwritten (a clear)."""
        while self.queue:
            self.finish(self.queue.popleft())

    def take(self, n: int) -> list[StagedPage]:
        """Under :attr:`cond`. The next ``n`` queued pages (or fewer)."""
        return [self.queue.popleft() for _ in range(min(n, len(self.queue)))]

    def finish(self, page: StagedPage) -> None:
        """Under :attr:`cond`. Release the page's buffer (or leave it to its last reader) and mark it done, exactly
        once."""
        if page.buf is not None:
            if page.readers:
                page.retired = True  # a reload is copying out of it: give_back releases it
            else:
                self.pool.release(page.kind, page.buf)
                page.buf = None
        if self._staged.get((page.kind, page.content_hash)) is page:
            del self._staged[(page.kind, page.content_hash)]
        self._unack(page)
        page.finished = True
        self.done += 1

    def close(self) -> None:
        self.pool.close()
