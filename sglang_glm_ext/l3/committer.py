"""The committer thread: makes one batch durable while the writer seals and submits the next.

Per batch: wait for every page's write -> one fdatasync per slab -> ONE index transaction for the batch's entries
(LMDB ``sync=True``) -> a :class:`~.messages.WriteResult` per page, handed back to the writer. Without this
overlap spill reached about 0.5x of raw on the dev VM. The committer never touches a pool or the LRU: the writer
applies every result, so those keep one owner.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Callable

from .index import IndexEntry, L3Index, now_us
from .messages import PendingWrite, WriteOutcome, WriteResult, failure

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
            except Exception as e:  # never lose a batch: report every page as failed
                f = failure(e)
                log.error("L3 commit stage failed: %s", f)
                results = [WriteResult(p.page, p.state, p.slot, WriteOutcome.ERROR, failure=f) for p in batch]
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
            for j, p in enumerate(synced):
                if res is None:
                    outcome = WriteOutcome.INDEX_FULL
                elif res[j] is None:
                    outcome = WriteOutcome.OK
                else:
                    outcome = WriteOutcome.DEDUP
                out.append(WriteResult(p.page, p.state, p.slot, outcome, last_access=ts))
        return out
