"""The committer thread: makes one batch durable while the writer seals and submits the next.

Per batch: wait for every page's write -> one fdatasync per slab -> ONE index transaction for the batch's entries
(LMDB ``sync=True``) -> a :class:`~.messages.WriteResult` per page, handed back to the writer. A commit the file
system refuses (a full disk) is resolved against the index page by page, so every page comes back with an outcome
that says whether its slot is referenced: a failed commit never keeps a slot it does not need (issue 20, item 1). Without this
overlap spill reached about 0.5x of raw on the dev VM. The committer never touches a pool or the LRU: the writer
applies every result, so those keep one owner.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Callable

from .index import IndexEntry, L3Index, now_us
from .messages import Failure, PendingWrite, WriteOutcome, WriteResult, failure

__all__ = ["Committer"]

log = logging.getLogger(__name__)


class Committer:
    """Input: batches of :class:`PendingWrite` through a queue of at most 2 (a slow disk stalls the writer, never a
    caller, and memory stays at the staging cap). Output: ``deliver(results)`` for every batch, in order; a
    batch is never lost (a failure of this stage reports every page as ``ERROR``)."""

    def __init__(self, index: L3Index, *, rank: int, disk: int, deliver: Callable[[list[WriteResult]], None],
                 name: str):
        self.index = index
        self.rank = rank
        self.disk = disk
        self._deliver = deliver
        self._queue: queue.Queue = queue.Queue(maxsize=2)
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, batch: list[PendingWrite]) -> None:
        """Writer thread. Blocks while 2 batches wait."""
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
            try:
                results = self.commit(batch)
            except Exception as e:  # never lose a batch: every page is resolved against the index (see _resolve)
                results = self._resolve(batch, 0, WriteOutcome.INDEX_ERROR, failure(e))
            batch = None  # nothing of this batch stays referenced while waiting for the next
            self._deliver(results)

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
            res = self.index.commit_puts([(p.page.key, IndexEntry(self.rank, self.disk, p.slot, ts)) for p in synced])
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
