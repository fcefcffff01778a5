"""Latency histograms the engine's threads record and the metrics push thread reads, so no data-path thread ever
touches prometheus_client (in SGLang's multiprocess mode an observation there is an mmap write).

One :class:`Latencies` per store, found by :func:`of` from the object every part of the store holds: its
``L3Index`` (the store, the writer, the committers and the reloader all have it). ``stats()["latency"]`` is
``of(index).snapshot()``. Recording is plain list and float adds, unlocked, as ``counters.py``: a lost add under a
thread race costs one observation of a diagnostic, never a data-path decision.
"""

from __future__ import annotations

import threading
import time
import weakref
from bisect import bisect_left
from contextlib import contextmanager

__all__ = ["BUCKETS_S", "KINDS", "Histogram", "Latencies", "of"]

# Upper bounds (seconds) shared with the Prometheus histograms: from a page-cache hit (sub-ms) to a stalled drive.
BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

# spill: one page, accepted by spill() -> durable (fdatasync'ed and committed); reload: one reload call;
# fdatasync: one slab's fdatasync in a commit; index_commit: one index write transaction.
KINDS = ("spill", "reload", "fdatasync", "index_commit")


class Histogram:
    """Counts per bucket (``counts[i]``: observations <= ``BUCKETS_S[i]`` and above the bound before; the last
    one: above every bound) and their sum. Cumulative for the store's life, like its counters."""

    __slots__ = ("counts", "sum")

    def __init__(self):
        self.counts = [0] * (len(BUCKETS_S) + 1)
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(BUCKETS_S, seconds)] += 1  # le semantics: a value on a bound is in that bucket
        self.sum += seconds

    def since(self, t0: float) -> None:
        """Observe ``time.monotonic() - t0``; a ``t0`` of 0 (a record never stamped) is no observation."""
        if t0 > 0:
            self.observe(time.monotonic() - t0)

    @contextmanager
    def time(self):
        """Observe the block's duration, also when it raises."""
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.since(t0)

    def snapshot(self) -> dict:
        return {"counts": list(self.counts), "sum": self.sum}


class Latencies:
    def __init__(self):
        self.spill = Histogram()
        self.reload = Histogram()
        self.fdatasync = Histogram()
        self.index_commit = Histogram()

    def snapshot(self) -> dict:
        """``{kind: {"counts": [...], "sum": s}}`` for every kind of :data:`KINDS`."""
        return {k: getattr(self, k).snapshot() for k in KINDS}


_BY_OWNER: "weakref.WeakKeyDictionary[object, Latencies]" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


_UNTRACKED = Latencies()  # for an owner that cannot be a weak key (a test double): recorded, never read


def of(owner: object) -> Latencies:
    """The histograms of the store ``owner`` belongs to (its index); made at the first call, gone with the owner.
    Never raises: it sits on the commit path, where a metrics failure must not become a failed commit."""
    try:
        got = _BY_OWNER.get(owner)
        if got is None:
            with _LOCK:  # two threads asking first must get one object
                got = _BY_OWNER.get(owner)
                if got is None:
                    got = _BY_OWNER[owner] = Latencies()
        return got
    except TypeError:  # unhashable or no weak reference
        return _UNTRACKED
