"""One reload call's reads in flight and its checksums: reads never wait on a checksum.

:class:`ReadBatch` keeps ``reload_threads`` reads in flight on the read pool: one task per reader, which takes the
next unit (:func:`~.coalesce.coalesce`) whenever it is free. A unit's read (stage 1) gives each page a final
``(ok, why)`` (a miss before the payload, a staged copy) or a :class:`Landed` page: views of the destination's own
bytes and the checksum its header promises, a hit only once stage 2 (the checksum) matched. With fewer than
:data:`HAND_OFF_BELOW` readers each hands its landed pages to a queue and issues its next read at once; the caller's
thread hashes from the first landed page on, helped by up to :func:`hash_helpers` pool threads when pages queue up
and by each reader once it is out of reads. With more readers each hashes its own page after its read: the others
keep the disk busy meanwhile, and the hand-off would only cost CPU.

:meth:`ReadBatch.run` returns when every read and checksum has finished: no thread of the call touches a destination
or a result after that. A step (a unit's read, a page's checksum) that raises costs only its own pages (a
``ReloadMiss.ERROR`` miss): every page gets a final result, so the caller never waits for one that will not come.
No pool task ever waits on another (readers wait on their reads, helpers never block), so calls running at the same
time cannot deadlock the pools.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, NamedTuple

from .messages import ReloadMiss

log = logging.getLogger(__name__)

__all__ = ["HAND_OFF_BELOW", "Landed", "ReadBatch", "hash_helpers"]

# Below this many readers each reader hands its landed page to the caller's thread (and helpers) to hash and goes on
# reading; from it on each reader hashes its own page right after its read (the hand-off's queue and wake-up per page
# cost CPU that only pays while few readers would otherwise leave the disk idle). Measured: docs_internal/l3_design.md,
# "Read-path measurements moved from engine/reload.py".
HAND_OFF_BELOW = 4

_ERROR = (False, ReloadMiss.ERROR)


def hash_helpers(reload_threads: int) -> int:
    """Pool threads that may help the caller hash when landed pages queue up: one per four reads in flight. One
    core hashes 5-12 GB/s cold (docs_internal/l3_design.md, "The checksum's cost"), so a reload that keeps more
    reads in flight than one core can check gets more checking cores, and a small one adds none."""
    return max(1, reload_threads // 4)


class Landed(NamedTuple):
    """Stage 1's hand-off to a hasher: the page's own bytes where they landed (views of the destination, never of
    a bounce buffer its reader reuses) and the payload checksum its header promises."""
    pieces: list
    want: int


class ReadBatch:
    """One call's units, read and checked. ``read(unit)`` is stage 1 of one unit (a list of page positions): one
    result per page, a final ``(ok, why)`` or a :class:`Landed`; ``check(landed)`` is stage 2 of a landed page, its
    final ``(ok, why)``. The results, by page position, come back from :meth:`run`."""

    def __init__(self, read: Callable[[list], list], check: Callable[[Landed], tuple], pages: int, *,
                 pool: ThreadPoolExecutor, hash_pool: ThreadPoolExecutor, helpers: int, reload_threads: int):
        self.read, self.check = read, check
        self.pool, self.hash_pool, self.helpers = pool, hash_pool, helpers
        self.reload_threads = reload_threads
        self.hash_here = reload_threads >= HAND_OFF_BELOW  # enough readers: each hashes its own pages
        self.out: list = [None] * pages  # each page's final result
        self.left = pages  # results not final yet
        self.helping = 0  # helper tasks of this call running now
        self.lock = threading.Lock()  # guards left and helping
        self.landed: "queue.SimpleQueue" = queue.SimpleQueue()  # (position, Landed) to hash; None: all final
        self.todo: collections.deque = collections.deque()  # units not taken yet; popleft() is atomic

    def run(self, units: "list[list[int]]") -> list:
        """Every page's final result, by position, once every read and checksum of ``units`` has finished."""
        if len(units) <= 1:  # nothing to overlap
            for unit in units:
                for j, r in zip(unit, self._step(self.read, unit, [_ERROR] * len(unit))):
                    self.out[j] = self._verified(r)
            return self.out
        self.todo.extend(units)
        futures = []
        for _ in range(min(self.reload_threads, len(units))):
            try:
                futures.append(self.pool.submit(self._reader))
            except RuntimeError:  # the pool is shut down (store closing): read on this thread
                self._reader()
        while (item := self.landed.get()) is not None:
            self._final(item[0], self._verified(item[1]))
        for f in futures:
            f.result()  # the readers' last step is a drain that finds nothing: quick
        return self.out

    def _step(self, fn: Callable, arg, failed):
        """``fn(arg)``, or ``failed`` (its pages' misses) where it raises."""
        try:
            return fn(arg)
        except Exception:  # noqa: BLE001 - a read or checksum that raises costs only its own pages, and never
            # leaves a page without a result (the call would wait for it); the read path maps what it knows itself
            log.debug("L3 reload: a read step raised; its pages are misses", exc_info=True)
            return failed

    def _verified(self, r) -> tuple:
        """Stage 2 of a landed page, or a stage-1 outcome as is: True only once the checksum matched."""
        if not isinstance(r, Landed):
            return r
        return self._step(self.check, r, _ERROR)

    def _reader(self) -> None:
        while True:
            try:
                unit = self.todo.popleft()
            except IndexError:
                break
            for j, r in zip(unit, self._step(self.read, unit, [_ERROR] * len(unit))):
                if not isinstance(r, Landed):
                    self._final(j, r)
                elif self.hash_here:  # the other readers keep the disk busy while this one hashes
                    self._final(j, self._verified(r))
                else:
                    self.landed.put((j, r))
                    self._call_helper()
        self._drain()  # out of reads: help hash the tail

    def _call_helper(self) -> None:
        """A helper task when landed pages queue up, up to ``helpers`` of this call at once."""
        if self.landed.qsize() <= 1 or self.helping >= self.helpers:
            return
        with self.lock:
            spawn = self.helping < self.helpers
            self.helping += spawn
        if not spawn:
            return
        try:
            self.hash_pool.submit(self._helper)
        except RuntimeError:  # shut down: the caller hashes alone
            with self.lock:
                self.helping -= 1

    def _helper(self) -> None:
        try:
            self._drain()
        finally:
            with self.lock:
                self.helping -= 1

    def _drain(self) -> None:
        """Hash what has landed; never wait (a pool thread that waited could hold a reader's worker)."""
        while True:
            try:
                item = self.landed.get_nowait()
            except queue.Empty:
                return
            if item is None:
                self.landed.put(None)  # the caller's wake-up: leave it for the caller
                return
            self._final(item[0], self._verified(item[1]))

    def _final(self, j: int, result) -> None:
        self.out[j] = result
        with self.lock:
            self.left -= 1
            last = self.left == 0
        if last:
            self.landed.put(None)  # wakes the caller: every result is final
