"""The committer thread: makes batches durable while the writer seals and submits the next ones.

Per commit: wait for every page's write -> one fdatasync per slab -> ONE index transaction for the commit's entries
(LMDB ``sync=True``) -> a :class:`~.messages.WriteResult` per page, handed back to the writer one batch at a time, in
order. A commit the file system refuses (a full disk) is resolved against the index page by page, so every page comes
back with an outcome that says whether its slot is referenced: a failed commit never keeps a slot it does not need.
The overlap with the writer is what lets a spill approach raw write speed; the committer never touches a pool or the
LRU: the writer applies every result, so those keep one owner.

Group commit: a commit takes every batch already waiting in its queue (up to :data:`GROUP_MAX`), so one
fdatasync and one index transaction (two device flushes in LMDB) cover them all; one commit per batch was the spill's
bottleneck (docs_internal/l3_tuning.md, "The committer"). Nothing is acknowledged earlier: a page's result still
follows its own write, the fdatasync and the index commit. A failure inside a grouped commit is resolved page by page,
as for one batch.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Callable

from . import latency
from .index import IndexEntry, L3Index, now_us
from .messages import Failure, PendingWrite, WriteOutcome, WriteResult, failure

__all__ = ["Committer", "GROUP_MAX", "QUEUE_MAX"]

# Batches one commit takes at most (those already waiting: a committer that keeps up commits one batch at a time).
GROUP_MAX = 4
# Batches waiting for the committer before ``submit`` blocks the writer: more than one group, so the next group's
# writes run while a group commits (the staging cap bounds the memory either way; the writer's backlog is one more).
QUEUE_MAX = 2 * GROUP_MAX - 1

log = logging.getLogger(__name__)


class Committer:
    """Input: batches of :class:`PendingWrite` through a queue of at most :data:`QUEUE_MAX` (a slow disk stalls the
    writer, never a caller, and memory stays at the staging cap). Output: ``deliver(results)`` for every batch, in
    order, each with a result for every page it had; a batch is never lost (a failure of this stage resolves every
    page against the index). ``group_max`` batches at most per commit (1: one commit per batch)."""

    def __init__(self, index: L3Index, *, rank: int, disk: int, deliver: Callable[[list[WriteResult]], None],
                 name: str, group_max: int = GROUP_MAX):
        self.index = index
        self.rank = rank
        self.disk = disk
        self._deliver = deliver
        self.group_max = max(1, group_max)
        self._queue: queue.Queue = queue.Queue(maxsize=QUEUE_MAX)
        self.commits = 0  # index transactions made (diagnostics, tests): fewer than batches when grouped
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, batch: list[PendingWrite]) -> None:
        """Writer thread. Blocks while QUEUE_MAX batches wait."""
        self._queue.put(batch)

    def stop(self) -> None:
        """Writer thread, after its last batch: the committer finishes what it holds and exits."""
        self._queue.put(None)
        self._thread.join()

    def _main(self) -> None:
        while True:
            batch = self._queue.get()
            if batch is None:
                return
            batches, stop = [batch], False
            while len(batches) < self.group_max:  # group commit: what is already waiting, never wait for more
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                    break
                batches.append(more)
            pages = batch if len(batches) == 1 else [p for b in batches for p in b]
            try:
                results = self.commit(pages)
            except Exception as e:  # never lose a batch: every page is resolved against the index (see _resolve)
                results = self._resolve(pages, 0, WriteOutcome.INDEX_ERROR, failure(e))
            self.commits += 1
            per_batch = _split(batches, results)
            batch = batches = pages = results = None  # nothing of these stays referenced while waiting for more
            for got in per_batch:
                self._deliver(got)
            if stop:
                return

    def commit(self, batch: list[PendingWrite]) -> list[WriteResult]:
        """Wait for the writes, fdatasync once per slab, commit the index in one transaction."""
        out: list[WriteResult] = []
        written = []
        for p in batch:
            failed = p.written.result()  # the write task returns its failure as plain data; it never raises
            if failed is None:
                written.append(p)
            else:
                out.append(WriteResult(p.page, p.state, p.slot, WriteOutcome.WRITE_ERROR, failure=failed))
        bad = {}
        for st in {id(p.state): p.state for p in written}.values():
            try:
                with latency.of(self.index).fdatasync.time():
                    st.slab.sync()
            except Exception as e:
                bad[st.kind] = failure(e)
        synced = []
        for p in written:
            if p.state.kind in bad:
                out.append(WriteResult(p.page, p.state, p.slot, WriteOutcome.WRITE_ERROR, failure=bad[p.state.kind]))
            elif p.page.cancelled:
                out.append(WriteResult(p.page, p.state, p.slot, WriteOutcome.CANCELLED))
            else:
                synced.append(p)
        if synced:
            ts = now_us()
            puts = [(p.page.key, IndexEntry(self.rank, self.disk, p.slot, ts)) for p in synced]
            with latency.of(self.index).index_commit.time():
                res = self.index.commit_puts(puts)
            if res is None:
                why = self.index.last_refusal
                if why is None or why.full:  # a full map: LMDB aborted the transaction, nothing of it is present
                    out += [WriteResult(p.page, p.state, p.slot, WriteOutcome.INDEX_FULL, last_access=ts,
                                        failure=Failure(None, str(why or "index map full"))) for p in synced]
                else:  # the file system refused the commit (a full disk): what landed is read back
                    out += self._resolve(synced, ts, WriteOutcome.INDEX_ERROR, Failure(None, str(why)))
                return out
            for j, p in enumerate(synced):
                outcome = WriteOutcome.OK if res[j] is None else WriteOutcome.DEDUP
                out.append(WriteResult(p.page, p.state, p.slot, outcome, last_access=ts))
        return out

    def _resolve(self, batch: list[PendingWrite], ts: int, refused: WriteOutcome,
                 why: Failure) -> list[WriteResult]:
        """A commit that failed, resolved page by page against the index (one read transaction): an entry of this page
        naming its slot landed (OK); no such entry means it did not (``refused``: the writer frees
        the slot, nothing names it). LMDB aborts a transaction whose commit fails, so a landed entry is only the rare
        case of a failure after the commit (or an unknown exception). Only when even the read fails (LMDB refuses
        every transaction after a failed meta-page write) is the outcome unknown: ERROR, the slot is kept (a leak
        until the next cold start, never a slot an entry may still name)."""
        try:
            landed = self.index.get_many([p.page.key for p in batch])
        except Exception as e:  # noqa: BLE001
            f = Failure(None, f"{why}; the index cannot be read back either ({failure(e)})")
            return [WriteResult(p.page, p.state, p.slot, WriteOutcome.ERROR, failure=f) for p in batch]
        out = []
        for p, e in zip(batch, landed):
            # The slot is this page's alone since the writer allocated it (a reclaim deletes an entry before its slot
            # is reused), so an entry of this page naming it can only be this commit's.
            if e is not None and e.same_location(IndexEntry(self.rank, self.disk, p.slot, 0)):
                out.append(WriteResult(p.page, p.state, p.slot, WriteOutcome.OK, last_access=e.last_access))
            else:
                out.append(WriteResult(p.page, p.state, p.slot, refused, failure=why))
        return out


def _split(batches: list, results: list[WriteResult]) -> list[list[WriteResult]]:
    """A grouped commit's results, one list per batch in batch order (each page's result with the batch it came in:
    a staged page is in one batch at a time, so its identity says which)."""
    if len(batches) == 1:
        return [results]
    where = {id(p.page): k for k, b in enumerate(batches) for p in b}
    out: list[list[WriteResult]] = [[] for _ in batches]
    for r in results:
        out[where[id(r.page)]].append(r)
    return out
