"""Whether a store's write paths work right now, and the one place that logs it.

A write path (the slab writes, the index commits) is *ok* or *failing*. A full or failing disk makes every batch,
GC round and touch fail the same way, many times a second: each failure is counted (the store's counters) and
reported here, but the log hears of it only when the state changes -- the first failure, the recovery -- and, while
it lasts, at most once per :data:`REPEAT_S` with a count: never a line or a traceback per round.

No flapping: a path that failed is back to *ok* only after :data:`SETTLE_OK` successes in a row or one success
:data:`SETTLE_S` after its last failure, and a new episode is logged at most once per :data:`MIN_GAP_S` (its
recovery only if its start was logged), so a disk at the edge of full costs at most two lines per gap.

Writer-thread only (the committer hands its results to the writer, which reports them), so nothing here is locked;
``stats()`` reads the flags from other threads as plain attribute reads.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

__all__ = ["WritePath", "Health", "REPEAT_S", "MIN_GAP_S", "SETTLE_OK", "SETTLE_S"]

log = logging.getLogger(__name__)

REPEAT_S = 60.0   # while a path keeps failing, one summary line at most this often
MIN_GAP_S = 10.0  # a new failing episode is logged at most this often
SETTLE_OK = 3     # successes in a row that end an episode...
SETTLE_S = 2.0    # ...or one success this long after the last failure

_WHAT = {"slab": "slab writes", "index": "index commits", "writer": "writer rounds"}
_EFFECT = {
    "slab": "pages are not written (counted in write_errors); durable pages stay readable",
    "index": "pages are not committed and reclaims wait (counted in index_write_errors and write_errors); their "
             "slots go back to the pool and durable pages stay readable",
    "writer": "the writer thread goes on (counted in data_path_errors)",
}


class WritePath:
    def __init__(self, name: str, rank: int, clock: Callable[[], float] = time.monotonic, where: str = ""):
        self.name = name
        self.rank = rank
        self.where = where  # " disk 2" for one of a rank's several disks, so the log says which drive
        self.failing = False
        self.failures = 0           # every failure ever (monotonic)
        self._since = 0.0
        self._last_fail_at = 0.0
        self._in_state = 0          # failures in this episode
        self._oks = 0               # successes in a row since the last failure
        self._last = ""
        self._logged = False        # this episode's start was logged
        self._next_summary = 0.0
        self._quiet_until = 0.0
        self._clock = clock

    def failed(self, why: object, *, exc_info: bool = False) -> None:
        """One more failure (``why``: what failed, as text). ``exc_info``: attach the traceback to the first line."""
        self.failures += 1
        now = self._clock()
        self._last, self._last_fail_at, self._oks = str(why), now, 0
        if not self.failing:
            self.failing, self._since, self._in_state = True, now, 1
            self._next_summary = now + REPEAT_S
            self._logged = now >= self._quiet_until
            if self._logged:
                self._quiet_until = now + MIN_GAP_S
                log.warning("L3 rank %d%s: %s failing (%s): %s; logged again at most every %.0f s while it lasts, "
                            "and when it recovers", self.rank, self.where, _WHAT.get(self.name, self.name), why,
                            _EFFECT.get(self.name, "counted"), REPEAT_S, exc_info=exc_info)
            return
        self._in_state += 1
        if now >= self._next_summary:
            self._next_summary = now + REPEAT_S
            log.warning("L3 rank %d%s: %s still failing: %d failures in %.0f s (last: %s)", self.rank, self.where,
                        _WHAT.get(self.name, self.name), self._in_state, now - self._since, self._last)

    def ok(self) -> None:
        """The path just worked."""
        if not self.failing:
            return
        self._oks += 1
        now = self._clock()
        if self._oks < SETTLE_OK and now - self._last_fail_at < SETTLE_S:
            return
        self.failing = False
        if self._logged:
            log.info("L3 rank %d%s: %s resumed after %d failures over %.1f s (last: %s)", self.rank, self.where,
                     _WHAT.get(self.name, self.name), self._in_state, now - self._since, self._last)


class Health:
    """The write paths of one store: ``slab`` per disk and ``index`` (what a full or failing disk fails), ``writer``
    (a bug the writer thread survived: logged with its traceback once per episode, never per round).

    A rank with several disks has a slab path per disk (``slab_on``): one drive failing is its own episode, logged
    with the disk's index, and the writer steers new pages away from it (writer.py) while the others stay ok."""

    def __init__(self, rank: int, clock: Callable[[], float] = time.monotonic, disks: "tuple[int, ...]" = (0,)):
        several = len(disks) > 1
        self.slabs = {d: WritePath("slab", rank, clock, f" disk {d}" if several else "") for d in disks}
        self.slab = self.slabs[disks[0]]  # the home disk's (a one-disk rank's only one)
        self.index = WritePath("index", rank, clock)
        self.writer = WritePath("writer", rank, clock)

    def slab_on(self, disk: int) -> WritePath:
        return self.slabs.get(disk, self.slab)

    def failing(self) -> list[str]:
        """The write paths failing right now (``stats()['write_path_failing']``): ``slab`` while any of the rank's
        disks fails its writes (``failing_disks`` says which), ``index``."""
        out = ["slab"] if any(p.failing for p in self.slabs.values()) else []
        return out + (["index"] if self.index.failing else [])

    def failing_disks(self) -> list[int]:
        return [d for d, p in self.slabs.items() if p.failing]
