"""``SharedStore``: the one store of (index, deployment, rank) in this process, what every ``L3Store`` handle points
at (store.py: the invariants, and the handles). This file holds its state and its short calls; the long ones live
in rooms of one concern each: lifecycle.py (open, kinds, close), spill.py (plan, then run), stats.py,
diagnostics.py (what tools and tests read of its insides)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Mapping, Sequence

from . import lifecycle
from ..config import COLD_START_MODES, L3Config, L3ConfigError
from ..disk.format import Namespace, PayloadKind, key_to_bytes
from ..disk.owner_lock import OwnerLock
from ..disk.slab import slow_write
from ..errors import L3StoreError
from .counters import Counters
from .diagnostics import Diagnostics
from .index import KeySpace, L3Index, deployment_tag
from .kinds import KindDisks
from .messages import ClearRank, Completion, FreePages
from .reload import Reloader, content_hashes
from .spill import spill as run_spill
from .stats import stats as store_stats

log = logging.getLogger(__name__)


def dropped(keys) -> list[bool]:
    """What a failed or closed call answers: one False per key (a dropped write or a miss), never an exception."""
    try:
        return [False] * len(list(keys))
    except TypeError:
        return []


class SharedStore:
    """One rank's view of the L3 tier. Callers never build it: :meth:`L3Store.open` does, once, and hands out
    counted :class:`L3Store` handles onto it. Its attributes are the engine's own (the rooms beside this file read
    them); tools and tests read it through the handle's surface and ``diagnostics()``."""

    def __init__(self, config: L3Config, *, rank: int, namespace: Namespace,
                 page_bytes: Mapping[PayloadKind | str, int], cold_start: str | None = None,
                 slow_write: Callable = slow_write):
        if not isinstance(config, L3Config):
            raise L3ConfigError(f"<config>: expected L3Config, got {type(config).__name__}")
        config.check_rank(rank)
        if not isinstance(namespace, Namespace):
            raise L3ConfigError(f"namespace: expected format.Namespace, got {type(namespace).__name__}")
        mode = cold_start or config.cold_start
        if mode not in COLD_START_MODES:
            raise L3ConfigError(f"cold_start: unknown mode {mode!r} (expected 'clear' or 'load')")
        kinds = lifecycle.parse_kinds(page_bytes)

        self.config = config
        self.rank = rank
        self.refs = 0  # L3Store handles open on it (L3Store.open / close, under store._OPEN_LOCK)
        self.owner_path = OwnerLock.path_for(config.index_path, config.deployment_id, rank)
        self.namespace = namespace
        # Every blob is sealed with, and checked against, a digest of the namespace AND the deployment: a blob of
        # another deployment never verifies here even if the two ever share slab files.
        self.ns = namespace.digest_for(config.deployment_id)
        self.dep = deployment_tag(config.deployment_id)
        self.disk = config.disk_for_rank(rank)  # home disk (the only one unless the mapping lists several)
        self.disks = config.disks_for_rank(rank)
        self.cold_start = mode
        self.c = Counters()
        self.closed = False
        self.slow_write = slow_write  # the TEST-ONLY slow disk's maker (store.py hands its own: a test seam)
        self.keys = KeySpace(self.dep, self.ns)
        self.kinds: dict[PayloadKind, KindDisks] = {}
        self.reloader: Reloader | None = None
        self.add_lock = threading.Lock()
        self.index: L3Index | None = None
        self.owner = None
        self._warned: set[str] = set()
        lifecycle.open_store(self, kinds, mode)

    def add_kind(self, kind, page_bytes: int, timeout: float = 30.0) -> None:
        """Serve one more payload kind from now on (SGLang registers sidecar draft host pools after the storage
        attach). Its slab is sized by the config alone (``L3Config.slots_for_kind``: ``payload_weights``), so it is
        the same slab whether the kind is added later or opened with the others. Under ``load`` its durable pages
        from before are kept (from the index alone, coldstart.load_kind), as at open. Idempotent for the same page
        size; loud (:class:`L3ConfigError` / :class:`L3StoreError`) for a size it cannot hold or a rule that cannot
        size it. The writer takes the new pool over through its control queue, so it stays the pools' only owner."""
        lifecycle.add_kind(self, kind, page_bytes, timeout)

    def ikey(self, kind: PayloadKind, content_hash: bytes) -> bytes:
        return self.keys.key(kind, content_hash)

    # ------------------------------------------------------------------ spill
    def spill(self, kind, keys: Sequence, pages: Sequence, *, wait: float = 0.0, durable: bool = False) -> list[bool]:
        """Copy each page into staging and queue it. Per page: True if accepted (durable soon, or already durable /
        staged: dedup), False if dropped (staging full, max inflight, bad input: counted). A page is a C-contiguous
        buffer of exactly page_bytes, taken in memory order; anything else is bad input. The caller may reuse or
        unpin its page buffers as soon as this returns.

        By default it returns at once and never blocks: a True is acknowledged before the page is durable
        (write-behind; ``stats()`` counts such pages, their bytes and the oldest one's age as
        ``acked_not_durable_*``: what a crash right now would lose, bounded by the staging cap). Two opt-ins,
        both bounded by ``wait`` seconds for the whole call (SGLang's backup thread, through the HiCache backend):

        * ``wait`` > 0: when staging is full, wait for room instead of dropping the page (brief backpressure);
        * ``durable``: answer True only for pages that are durable when it returns (fdatasync'ed and committed,
          or committed already): what a crash after the return cannot lose. A page not durable by the deadline
          answers False (it may still become durable later)."""
        return run_spill(self, kind, keys, pages, None, None, wait, durable)

    def spill_from_layout(self, kind, keys: Sequence, layout, page_indices: Sequence[int], *, wait: float = 0.0,
                          durable: bool = False) -> list[bool]:
        """Like :meth:`spill`, gathering each page from a strided host layout straight into staging."""
        return run_spill(self, kind, keys, None, layout, page_indices, wait, durable)

    def wait_durable(self, kind, keys: Sequence, timeout: float) -> list[bool]:
        """Whether each page is durable (its index entry committed, by any rank), waiting up to ``timeout`` s for
        the ones that are not yet: under CP, ``ack = "durable"`` of pages another rank owns and writes."""
        try:
            kind = PayloadKind.parse(kind)
            ikeys = [self.ikey(kind, h) if h is not None else None for h in content_hashes(list(keys))]
            deadline = time.monotonic() + max(0.0, timeout)
            while True:
                got = [e is not None for e in self.index.get_many(ikeys)]
                if all(got) or time.monotonic() >= deadline:
                    return got
                with self.staged.cond:
                    self.staged.cond.wait(min(0.005, max(0.0, deadline - time.monotonic())))
        except Exception:
            self.c.data_path_errors += 1
            return dropped(keys)

    # ------------------------------------------------------------------ exists
    def exists(self, kind, keys: Sequence, *, include_staged: bool = True) -> int:
        """Length of the contiguous prefix of ``keys`` that a reload would serve: pages durable (index entry
        committed) or staged (accepted by ``spill``, not cancelled, not failed). ``include_staged=False``: durable
        pages only, what "acknowledged" means (tools, durability tests)."""
        try:
            kind = PayloadKind.parse(kind)
            hashes = []
            for k in keys:
                try:
                    hashes.append(key_to_bytes(k))
                except ValueError:
                    break
            # Staged first, then the index: a page that goes from staged to durable between the two looks is
            # seen by one of them (finish removes it from staging only after its entry is committed).
            staged = self.staged.visible(kind, hashes) if include_staged else [False] * len(hashes)
            rest = [i for i, s in enumerate(staged) if not s]
            end = len(hashes)
            # A page freed and not yet deleted by the writer is not present (unless staged again since).
            freed = self.staged.freed(kind, [hashes[i] for i in rest]) if self.staged.free_pending else ()
            if any(freed):
                cut = freed.index(True)
                end, rest = rest[cut], rest[:cut]
            prefix = self.keys.prefix(kind)
            durable = self.index.prefix_len(prefix + hashes[i] for i in rest)
            return rest[durable] if durable < len(rest) else end
        except Exception:
            self.c.data_path_errors += 1
            return 0

    # ------------------------------------------------------------------ reload
    def reload_into(self, kind, keys: Sequence, dsts: Sequence) -> list[bool]:
        """Read each page into ``dsts[i]``: a writable, C-contiguous buffer of at least page_bytes (the page lands
        in its first page_bytes, in memory order). True only if the blob verified AND its bytes are now in the
        caller's buffer. A destination that cannot take the page in place (strided, Fortran-ordered, read-only,
        too small, or overlapping an earlier page's destination in the same call) is a miss counted in
        ``reload_bad_dst`` and is left untouched. On any other False the page's own bytes (``dsts[i][:page_bytes]``)
        may have been overwritten -- the read lands in place and is verified there (reload.py) -- and nothing
        outside them is touched: treat the page as not loaded."""
        return self.reloader.reload(kind, keys, dsts=dsts)

    def reload_into_layout(self, kind, keys: Sequence, layout, page_indices: Sequence[int]) -> list[bool]:
        """Like :meth:`reload_into`, into page ``page_indices[i]`` of a host layout, each slice where it lives (a
        vectored O_DIRECT read into the layer chunks). On False that page's slices may have been overwritten;
        other pages and bytes between the slices are never touched."""
        return self.reloader.reload(kind, keys, layout=layout, page_indices=page_indices)

    def warn_once(self, what: str, msg: str, *args) -> None:
        """Caller bugs on the data path are counted every time and logged once per store (no log flood)."""
        if what not in self._warned:
            self._warned.add(what)
            log.warning(msg, *args)

    # ------------------------------------------------------------------ free / clear / flush
    def free(self, kind, keys: Sequence) -> None:
        """Remove pages from L3 (index entry first, then this rank's slot; the writer applies it). Staged copies are
        cancelled, and from the return on a freed page is absent for ``exists`` and no dedup for ``spill`` until
        the writer has deleted its entry: a page spilled again after ``free`` is staged and written anew."""
        try:
            kind = PayloadKind.parse(kind)
            hashes = [h for h in content_hashes(list(keys)) if h is not None]
            with self.staged.cond:
                self.staged.note_free(kind, hashes)  # before the post: the writer's free_done follows it
            self.writer.post(FreePages(kind, tuple(self.ikey(kind, h) for h in hashes), tuple(hashes)))
        except Exception:
            self.c.data_path_errors += 1

    def clear(self, timeout: float = 60.0) -> bool:
        """Drop everything this rank owns (this deployment only) and wait for it. Counters are not reset.
        True only if everything was dropped in time; False if the index could not delete it all (the pages
        that survive stay present and consistent) or the writer did not get to it within ``timeout``."""
        done = Completion()
        with self.staged.cond:
            self.staged.cancel_all()
        self.writer.post(ClearRank(done))
        return done.wait(timeout) and done.ok

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Wait until every operation issued before this call has taken effect. True (in time) promises:

        * every page a ``spill`` accepted before the call is durable (``exists(include_staged=False)`` counts it)
          or finished as dropped / failed (counted in ``stats()``), and no page of it is left in staging;
        * every ``free`` and ``clear`` before the call is applied (entries deleted, slots back in the pool);
        * every ``reload`` that returned before the call has had its consequences: a page that failed
          verification has had its entry reclaimed (``exists`` no longer counts it), and its hits are in the LRU
          and persisted to the index (what a later ``load`` or another rank's GC sees);
        * GC is back under its watermarks.

        False: the timeout passed or the writer is gone; any of the above may still be pending. For tests,
        benchmarks and shutdown (``close`` flushes)."""
        return self.writer.flush(timeout)

    # ------------------------------------------------------------------ for tools and tests
    def slab(self, kind, disk: "int | None" = None) -> Any:
        """This rank's writable ``DiskSlab`` for ``kind`` on ``disk`` (its home disk by default) (fault injection in
        tests, diagnostics)."""
        grp = self.kinds[PayloadKind.parse(kind)]
        st = grp.home if disk is None else grp.on(disk)
        if st is None:
            raise L3StoreError(f"rank {self.rank} writes no slab on disk {disk} (its disks: {list(self.disks)})")
        return st.slab

    def locate(self, kind, key) -> "tuple[int, int, int] | None":
        """Where a durable page lives: (rank, disk, slot) of its committed index entry, or None (absent, only
        staged, or a key that is not one). For tools and tests (fsck, fault injection); not the data path."""
        try:
            e = self.index.get(self.ikey(PayloadKind.parse(kind), key_to_bytes(key)))
        except Exception:
            return None
        return None if e is None else (e.rank, e.disk, e.slot)

    def diagnostics(self) -> Diagnostics:
        return Diagnostics(self)

    def stats(self) -> dict:
        return store_stats(self)

    def close(self, timeout: float = 30.0) -> None:
        lifecycle.close(self, timeout)

    def incompatibility(self, config: L3Config, namespace: Namespace, kinds: Mapping[PayloadKind, int]) -> str:
        return lifecycle.incompatibility(self, config, namespace, kinds)
