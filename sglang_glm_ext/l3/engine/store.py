"""L3Store: the durable disk tier for one rank, as its callers see it: spill, exists, reload, free, clear, flush.

Who owns what (the full table, and a page's path from ``spill`` to the slab and back: docs_internal/l3_design.md):

* Caller threads (the scheduler / HiCache I/O threads) call the methods below. Each call decides once, up front,
  what the call needs (plan: the payload kind, the keys, which pages are present, which destinations can take
  their page in place), then runs with no decision left. ``spill`` only copies into staging (staging.py) and
  queues; it never touches a slot pool and never blocks on the disk. ``reload`` reads straight into the caller's
  memory and verifies the bytes there (reload.py), on the caller's thread plus a small read pool.
* ONE writer thread (writer.py) owns every slot pool and page LRU; its committer thread (committer.py) makes
  batches durable; every reclaim (reclaim.py) deletes the index entry before the slot is reused.
* ``open`` wires them, in this order: owner lock -> slab directories -> PLP -> slabs + sidecars -> index -> cold
  start (coldstart.py, before the writer exists) -> staging, readers, writer.
* A rank with several disks (``ranks.mapping`` entry ``[0, 1, ...]``) has a slab per (kind, disk), each sized by the
  rank's share of that disk; the writer places each new page on one of them (writer.py), and everything else
  follows the index entry, which names the disk.

Invariants (the crash-safety argument is in docs_internal/l3_design.md):

1. A page is present (``exists`` counts it, ``reload`` may return it) only once its index entry is committed,
   and an entry is committed only after the payload's fdatasync returned (and the slab's name is durable).
2. Reclaim (GC, free, verify failure) deletes the index entry, commits, and only then frees the slot: a reader
   that looked the entry up earlier reads either the old blob or a newer one whose header names a different
   page (verify -> miss). It never gets another page's bytes. A verify-failure reclaim deletes only the exact
   entry the reader saw, never a newer commit of the same page into the same slot.
3. Every slot an index entry of this rank references is allocated in its pool: after a ``load`` cold start and
   after a runtime ``clear`` (also one the index could only do in part); the pool only hands out free slots.
4. Data-path calls never raise: a failure is a miss plus a counter, and one bad element (key, destination,
   index value) costs only its own page. Bad configuration raises at ``open``.
5. A blob is checked against the page asked for AND this deployment (``Namespace.digest_for``); reload returns
   True only when the verified bytes are in the caller's own buffer (C-contiguous, writable, large enough; a
   layout whose page size is the kind's). The destination is checked once, in the plan, the same way whether the
   page would come from staging or from the slab; ``spill_from_layout`` refuses a layout of another page size.
6. One live store per (index, deployment, rank), on the node and in the process (``OwnerLock``). In the process
   it is shared: ``L3Store.open`` hands out counted handles onto the one ``SharedStore`` (same config, namespace and
   kinds, else refused), its cold start runs at the first open, and the last handle's close closes it.
"""

from __future__ import annotations

import dataclasses
import errno
import itertools
import logging
import os
import threading
import time
from typing import Any, Mapping, Sequence

import numpy as np

from . import coldstart, slab_set
from ..disk.aligned import page_array
from ..config import COLD_START_MODES, L3Config, L3ConfigError
from .counters import Counters
from ..disk.slab import check_plp, probe_plp, slow_write
from ..errors import L3OwnerLockedError, L3StoreError
from ..disk.format import PAYLOAD_OFFSET, Namespace, PayloadKind, key_to_bytes, slot_bytes_for
from ..disk.fsutil import make_private_dirs
from .index import KeySpace, L3Index, deployment_tag
from .kinds import KindDisks, KindState
from .messages import AddKind, Admission, ClearRank, Completion, FreePages
from ..disk.owner_lock import OwnerLock, OwnerLockHeld
from .reload import Reloader, content_hashes, layout_mismatch
from ..disk.slab_dir import read_slab_meta, slab_path  # noqa: F401 - re-exported for callers of the store
from ..disk.slab_reader import SlabReader
from .staging import StagedPages, StagingPool
from .writer import Writer

log = logging.getLogger(__name__)

__all__ = ["L3Store", "SharedStore", "L3StoreError", "L3OwnerLockedError", "ReadOnlySlab", "slab_path",
           "read_slab_meta"]

# Kept importable from here for callers written against the single-file store; their homes are in the imports.
ReadOnlySlab = SlabReader


def _parse_kinds(page_bytes: Mapping[PayloadKind | str, int]) -> dict[PayloadKind, int]:
    kinds: dict[PayloadKind, int] = {}
    for k, n in page_bytes.items():
        try:
            kind = PayloadKind.parse(k)
        except ValueError as e:
            raise L3ConfigError(f"page_bytes: {e}") from None
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise L3ConfigError(f"page_bytes.{kind.label}: expected a positive int, got {n!r}")
        kinds[kind] = n
    if not kinds:
        raise L3ConfigError("page_bytes: at least one payload kind is required")
    return kinds


class SharedStore:
    """One rank's view of the L3 tier: the one store of (index, deployment, rank) in this process. Callers never
    build it: :meth:`L3Store.open` does, once, and hands out counted :class:`L3Store` handles onto it."""

    def __init__(self, config: L3Config, *, rank: int, namespace: Namespace,
                 page_bytes: Mapping[PayloadKind | str, int], cold_start: str | None = None):
        if not isinstance(config, L3Config):
            raise L3ConfigError(f"<config>: expected L3Config, got {type(config).__name__}")
        config.check_rank(rank)
        if not isinstance(namespace, Namespace):
            raise L3ConfigError(f"namespace: expected format.Namespace, got {type(namespace).__name__}")
        mode = cold_start or config.cold_start
        if mode not in COLD_START_MODES:
            raise L3ConfigError(f"cold_start: unknown mode {mode!r} (expected 'clear' or 'load')")
        kinds = _parse_kinds(page_bytes)

        self.config = config
        self.rank = rank
        self.refs = 0  # L3Store handles open on it (L3Store.open / close, under _OPEN_LOCK)
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
        self._closed = False
        self._warned: set[str] = set()
        self._keys = KeySpace(self.dep, self.ns)
        self._kinds: dict[PayloadKind, KindDisks] = {}
        self._reloader: Reloader | None = None
        self._add_lock = threading.Lock()
        self.index: L3Index | None = None
        self._owner: OwnerLock | None = None

        slot_bytes = {k: slot_bytes_for(n) for k, n in kinds.items()}
        nslots = {d: config.slots_per_kind(rank, {k.label: b for k, b in slot_bytes.items()}, d) for d in self.disks}
        sdir = config.slab_dir(rank)
        # One live owner per (deployment, rank) on an index, taken before anything is created or deleted for it.
        try:
            make_private_dirs(config.index_path)
            self._owner = OwnerLock.acquire(config.index_path, config.deployment_id, rank, owner=self,
                                            info={"slab_dir": sdir, "deployment_id": config.deployment_id,
                                                  "rank": rank})
        except OwnerLockHeld as e:
            raise L3OwnerLockedError(str(e), holder=e.holder, in_this_process=e.in_this_process) from None
        except OSError as e:
            raise L3StoreError(f"index.path: cannot take the owner lock for rank {rank} in "
                               f"{config.index_path!r}: {e}") from e
        try:
            self._open_owned(kinds, slot_bytes, nslots, mode)
        except BaseException:
            self._close_files()
            raise

    def _open_owned(self, kinds: dict[PayloadKind, int], slot_bytes, nslots, mode: str) -> None:
        """The rest of open, run once this store owns (deployment, rank): slabs, PLP, index, cold start, threads."""
        config, rank = self.config, self.rank
        self.plps = {}
        for d in self.disks:
            ddir = config.slab_dir(rank, d)
            try:
                # Before the PLP probe, which must see the disk's own device. Missing directories owner-only;
                # existing ones (the configured disk path, a pre-made deployment directory) keep their mode.
                make_private_dirs(ddir)
                if not os.access(ddir, os.W_OK):
                    raise PermissionError(errno.EACCES, "not writable", ddir)
            except OSError as e:
                raise L3StoreError(f"disks[{d}].path: cannot create slab directory {ddir!r}: {e}") from e

            # Power-loss protection: decided once per disk, loud when require_plp and the disk is not known safe.
            try:
                self.plps[d] = probe_plp(config.disks[d].path, plp=config.plp)
                check_plp(self.plps[d], config.require_plp)
            except Exception as e:
                raise L3StoreError(f"disks[{d}]: power-loss protection check failed: {e}") from e
        self.plp = self.plps[self.disk]

        self._seq = itertools.count(1)  # one LRU push order across the kinds
        prior_meta: dict[tuple[PayloadKind, int], dict | None] = {}  # each slab's sidecar as its last owner left it
        try:
            for kind, pb in kinds.items():
                self._kinds[kind] = self._open_kind(kind, pb, slot_bytes[kind],
                                                    {d: n[kind.label] for d, n in nslots.items()}, prior_meta)
            self.index = L3Index.open(config.index_path, config.index_map_size, check=config.index_check,
                                      on_damage=config.index_on_damage)
        except Exception as e:
            self._close_files()
            if isinstance(e, (L3StoreError, L3ConfigError)):
                raise
            raise L3StoreError(f"L3 store open failed for rank {rank}: {type(e).__name__}: {e}") from e

        # Cold start runs single-threaded, BEFORE the writer exists: the writer is the sole pool/LRU owner after.
        # Entries of kinds the config sizes alone but that are not open yet wait for add_kind (load_kind).
        deferred = [k for k in map(PayloadKind.parse, config.addable_kinds) if k not in self._kinds]
        try:
            done = coldstart.apply(mode, self.index, self._keys, rank, self._kinds, prior_meta, deferred)
            for grp in self._kinds.values():  # slabs of other page sizes: emptied ones go, the capacity is settled
                for st in grp.parts:
                    slab_set.settle(st, punch=True)
        except Exception as e:
            self._close_files()
            if isinstance(e, L3StoreError):
                raise
            raise L3StoreError(f"cold_start={mode}: failed for rank {rank}: {type(e).__name__}: {e}") from e
        self.loaded_pages, self.stale_dropped = done.loaded_pages, done.stale_dropped
        self.other_namespace_pages = done.other_pages

        self._staging = StagingPool(config.staging_bytes, slot_bytes)
        self._staged = StagedPages(self._staging, max_inflight=config.max_inflight,
                                   batch_pages=config.write_batch_pages * len(self.disks))
        self._reloader = Reloader(config, rank, self._kinds, self.ns, index=self.index, keys=self._keys,
                                  staged=self._staged, counters=self.c, warn_once=self._warn_once,
                                  note_reloads=lambda *a: self._writer.note_reloads(*a))
        self._writer = Writer(config, rank=rank, keys=self._keys, index=self.index,
                              kinds=self._kinds, staged=self._staged, counters=self.c)
        self._writer.start()

    def _open_kind(self, kind: PayloadKind, page_bytes: int, slot_bytes: int, num_slots: Mapping[int, int],
                   prior_meta: dict) -> KindDisks:
        """This rank's slab of one kind on each of its disks and the slabs of other slot sizes beside each
        (slab_set.py); each slab's sidecar as the previous owner left it goes into ``prior_meta[(kind, disk)]`` (a
        ``load`` keeps a slab's entries only if it vouches for them). Nothing stays open if one disk fails."""
        states: list[KindState] = []
        try:
            for d in self.disks:
                st, prior_meta[(kind, d)] = slab_set.open_kind(
                    self.config, rank=self.rank, disk=d, kind=kind, page_bytes=page_bytes, slot_bytes=slot_bytes,
                    num_slots=num_slots[d], ns_digest=self.ns, seq=self._seq)
                states.append(st)
                if self.config.test_write_delay_ms:
                    log.warning("L3 rank %d %s disk %d: TEST-ONLY slow disk, every slab write sleeps %d ms "
                                "(SGLANG_GLM_EXT_L3_TEST_WRITE_DELAY_MS)", self.rank, kind.label, d,
                                self.config.test_write_delay_ms)
                    st.slab.inject_write_fault(slow_write(self.config.test_write_delay_ms / 1000.0))
        except BaseException:
            for st in states:
                slab_set.close_kind(st)
            raise
        return KindDisks(states)

    def add_kind(self, kind, page_bytes: int, timeout: float = 30.0) -> None:
        """Serve one more payload kind from now on (SGLang registers sidecar draft host pools after the storage
        attach). Its slab is sized by the config alone (``L3Config.slots_for_kind``: ``payload_weights``), so it is
        the same slab whether the kind is added later or opened with the others. Under ``load`` its durable pages
        from before are kept (from the index alone, coldstart.load_kind), as at open. Idempotent for the same page size; loud
        (:class:`L3ConfigError` / :class:`L3StoreError`) for a size it cannot hold or a rule that cannot size it.
        The writer takes the new pool over through its control queue, so it stays the pools' only owner."""
        kind = _parse_kinds({kind: page_bytes}).popitem()[0]
        with self._add_lock:
            st = self._kinds.get(kind)
            if st is not None:
                if st.page_bytes != page_bytes:
                    raise L3StoreError(f"payload kind {kind.label} is open with {st.page_bytes} B pages; "
                                       f"{page_bytes} B asked (one geometry per kind and namespace)")
                return
            if self._closed:
                raise L3StoreError(f"rank {self.rank}'s L3 store is closed; cannot add {kind.label}")
            sb = slot_bytes_for(page_bytes)
            n = {d: self.config.slots_for_kind(self.rank, kind.label, sb, d) for d in self.disks}
            prior: dict = {}
            try:
                state = self._open_kind(kind, page_bytes, sb, n, prior)
            except (L3StoreError, L3ConfigError):
                raise
            except Exception as e:
                raise L3StoreError(f"add_kind {kind.label} for rank {self.rank}: {type(e).__name__}: {e}") from e
            try:
                loaded = 0
                if self.cold_start == "load":
                    loaded = coldstart.load_kind(self.index, self._keys, self.rank, state, prior).loaded_pages
                for st in state.parts:
                    slab_set.settle(st, punch=True)  # (under clear the open already deleted the rank's entries)
                self._staging.add_kind(kind, sb)
                self._reloader.add_kind(kind, sb)
                done = Completion()
                self._writer.post(AddKind(state, done))
                if not done.wait(timeout) or not done.ok:
                    raise L3StoreError(f"add_kind {kind.label}: the writer did not take the new pool over in "
                                       f"{timeout} s")
            except BaseException:
                if kind not in self._kinds:
                    for st in state.parts:
                        slab_set.close_kind(st)
                raise
            self.loaded_pages += loaded

    def _ikey(self, kind: PayloadKind, content_hash: bytes) -> bytes:
        return self._keys.key(kind, content_hash)

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
        return self._spill(kind, keys, pages, None, None, wait, durable)

    def spill_from_layout(self, kind, keys: Sequence, layout, page_indices: Sequence[int], *, wait: float = 0.0,
                          durable: bool = False) -> list[bool]:
        """Like :meth:`spill`, gathering each page from a strided host layout straight into staging."""
        return self._spill(kind, keys, None, layout, page_indices, wait, durable)

    def wait_durable(self, kind, keys: Sequence, timeout: float) -> list[bool]:
        """Whether each page is durable (its index entry committed, by any rank), waiting up to ``timeout`` s for
        the ones that are not yet: under CP, ``ack = "durable"`` of pages another rank owns and writes."""
        try:
            kind = PayloadKind.parse(kind)
            ikeys = [self._ikey(kind, h) if h is not None else None for h in content_hashes(list(keys))]
            deadline = time.monotonic() + max(0.0, timeout)
            while True:
                got = [e is not None for e in self.index.get_many(ikeys)]
                if all(got) or time.monotonic() >= deadline:
                    return got
                with self._staged.cond:
                    self._staged.cond.wait(min(0.005, max(0.0, deadline - time.monotonic())))
        except Exception:
            self.c.data_path_errors += 1
            return _dropped(keys)

    def _spill(self, kind, keys, pages, layout, page_indices, wait: float = 0.0, durable_ack: bool = False
               ) -> list[bool]:
        out: list[bool] = []
        queued = 0
        try:
            keys = list(keys)  # any iterable; None or a non-iterable is caught below like any bad input
            n = len(keys)
            out = [False] * n
            kind = PayloadKind.parse(kind)
            st = self._kinds[kind]
            if self._closed:
                return out
            # Plan: keys, what is durable already (one index read), and how a page reaches its staging buffer.
            hashes = content_hashes(keys)
            ikeys = [self._ikey(kind, h) if h is not None else None for h in hashes]
            present = iter(self.index.get_many([k for k in ikeys if k is not None]))
            durable = [next(present) is not None if k is not None else False for k in ikeys]
            # A page freed and not yet deleted by the writer is no dedup: its entry is about to go.
            freed = self._staged.freed(kind, [h for h in hashes if h is not None]) if self._staged.free_pending else ()
            if any(freed):
                it = iter(freed)
                durable = [d and not next(it) if h is not None else d for d, h in zip(durable, hashes)]
            pb = st.page_bytes  # the writer's seal_blob zeroes the pad and writes the header
            c = self.c
            if layout is None:
                def fill(i: int, buf, dst: np.ndarray) -> None:
                    src = page_array(pages[i], writable=False)
                    if src.nbytes != pb:
                        raise ValueError(f"page {i} has {src.nbytes} B, expected {pb}")
                    np.copyto(dst[PAYLOAD_OFFSET:PAYLOAD_OFFSET + pb], src)
            else:
                refused = layout_mismatch(st, layout)
                if refused:
                    # Every page of the call is bad input: a smaller layout would leave stale staging bytes inside
                    # the sealed payload (a wrong page made durable), a larger one would not fit the slot.
                    c.dropped_bad_input += n
                    self._warn_once("bad_layout", "L3 spill: source refused (%s); the pages are dropped", refused)
                    return out

                def fill(i: int, buf, dst: np.ndarray) -> None:
                    layout.gather_into(page_indices[i], buf.view, PAYLOAD_OFFSET)
            # Run.
            staged, staging = self._staged, self._staging
            deadline = time.monotonic() + wait if wait > 0 else 0.0
            waits: list[tuple[int, Any]] = []  # ack = durable: (page, its staged copy) answered once finished
            for i in range(n):
                h = hashes[i]
                if h is None:
                    c.dropped_bad_input += 1
                    continue
                if durable[i]:
                    c.dedup += 1
                    out[i] = True
                    continue
                buf = None
                while True:
                    admitted = staged.admit(kind, h)
                    if admitted is Admission.STAGE:
                        buf = staging.acquire(kind)
                        if buf is not None:
                            break
                    elif admitted is Admission.DEDUP:
                        break
                    # Staging (bytes or in-flight pages) is full: wait for room if the caller may wait, else drop.
                    if not deadline or self._closed:
                        break
                    if queued:
                        staged.wake()  # what this call queued must drain first
                    if not staged.wait_room(deadline):
                        break
                if admitted is Admission.DEDUP:
                    c.dedup += 1
                    self._answer_dedup(kind, h, ikeys[i], i, out, waits, durable_ack)
                    continue
                if buf is None:
                    c.dropped_staging += 1
                    continue
                try:
                    dst = np.frombuffer(buf.view, dtype=np.uint8)
                    fill(i, buf, dst)
                except Exception:
                    staging.release(kind, buf)
                    c.dropped_bad_input += 1
                    continue
                page = staged.enqueue(kind, h, ikeys[i], buf, acked=not durable_ack, nbytes=pb)
                if page is None:  # raced with another spiller of the same page
                    c.dedup += 1
                    self._answer_dedup(kind, h, ikeys[i], i, out, waits, durable_ack)
                    continue
                queued += 1
                if durable_ack:
                    waits.append((i, page))
                else:
                    out[i] = True
            if waits:
                if queued:
                    staged.wake()
                    queued = 0
                staged.wait_finished([p for _, p in waits], deadline or time.monotonic())
                for i, p in waits:
                    out[i] = p.finished and p.durable
            c.spill_accepted += sum(out)
        except Exception:
            log.exception("L3 spill failed; pages dropped")
            self.c.data_path_errors += 1
        finally:
            if queued:  # also after a failure part-way: what was queued must not wait for the next call
                self._staged.wake()
        return out

    def _answer_dedup(self, kind, h: bytes, ikey: bytes, i: int, out: list, waits: list, durable_ack: bool) -> None:
        """A page another spill staged already: accepted (write-behind), or answered with that copy (durable)."""
        if not durable_ack:
            out[i] = True
            return
        with self._staged.cond:
            page = self._staged.find(kind, h)
        if page is not None and not page.cancelled:
            waits.append((i, page))
        else:  # finished meanwhile: durable if its entry is there
            out[i] = self.index.get(ikey) is not None

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
            staged = self._staged.visible(kind, hashes) if include_staged else [False] * len(hashes)
            rest = [i for i, s in enumerate(staged) if not s]
            end = len(hashes)
            # A page freed and not yet deleted by the writer is not present (unless staged again since).
            freed = self._staged.freed(kind, [hashes[i] for i in rest]) if self._staged.free_pending else ()
            if any(freed):
                cut = freed.index(True)
                end, rest = rest[cut], rest[:cut]
            prefix = self._keys.prefix(kind)
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
        ``reload_bad_dst`` and is left untouched. On any other False the page's
        own bytes (``dsts[i][:page_bytes]``) may have been overwritten -- the read lands in place and is verified
        there (reload.py) -- and nothing outside them is touched: treat the page as not loaded."""
        return self._reloader.reload(kind, keys, dsts=dsts)

    def reload_into_layout(self, kind, keys: Sequence, layout, page_indices: Sequence[int]) -> list[bool]:
        """Like :meth:`reload_into`, into page ``page_indices[i]`` of a host layout, each slice where it lives (a
        vectored O_DIRECT read into the layer chunks). On False that page's slices may have been overwritten;
        other pages and bytes between the slices are never touched."""
        return self._reloader.reload(kind, keys, layout=layout, page_indices=page_indices)

    def _warn_once(self, what: str, msg: str, *args) -> None:
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
            with self._staged.cond:
                self._staged.note_free(kind, hashes)  # before the post: the writer's free_done follows it
            self._writer.post(FreePages(kind, tuple(self._ikey(kind, h) for h in hashes), tuple(hashes)))
        except Exception:
            self.c.data_path_errors += 1

    def clear(self, timeout: float = 60.0) -> bool:
        """Drop everything this rank owns (this deployment only) and wait for it. Counters are not reset.
        True only if everything was dropped in time; False if the index could not delete it all (the pages
        that survive stay present and consistent) or the writer did not get to it within ``timeout``."""
        done = Completion()
        with self._staged.cond:
            self._staged.cancel_all()
        self._writer.post(ClearRank(done))
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
        return self._writer.flush(timeout)

    def slab(self, kind, disk: "int | None" = None) -> Any:
        """This rank's writable ``DiskSlab`` for ``kind`` on ``disk`` (its home disk by default) (fault injection in
        tests, diagnostics)."""
        grp = self._kinds[PayloadKind.parse(kind)]
        st = grp.home if disk is None else grp.on(disk)
        if st is None:
            raise L3StoreError(f"rank {self.rank} writes no slab on disk {disk} (its disks: {list(self.disks)})")
        return st.slab

    def locate(self, kind, key) -> "tuple[int, int, int] | None":
        """Where a durable page lives: (rank, disk, slot) of its committed index entry, or None (absent, only
        staged, or a key that is not one). For tools and tests (fsck, fault injection); not the data path."""
        try:
            e = self.index.get(self._ikey(PayloadKind.parse(kind), key_to_bytes(key)))
        except Exception:
            return None
        return None if e is None else (e.rank, e.disk, e.slot)

    # ------------------------------------------------------------------ stats / close
    def stats(self) -> dict:
        kinds = list(self._kinds.items())  # one C-level copy: the writer may add a kind meanwhile (add_kind)
        with self._staged.cond:
            qdepth = len(self._staged.queue)
            inflight = self._staged.inflight
        out = {
            "rank": self.rank,
            "disk": self.disk,  # the home disk
            "disks": list(self.disks),
            "cold_start": self.cold_start,
            "cold_start_loaded_pages": self.loaded_pages,  # pages a `load` cold start kept (0 after `clear`)
            "io_mode": {k.label: getattr(grp.home.slab, "io_mode", None) for k, grp in kinds},
            # total: the slots this kind's slabs may use now (its capacity: beside a slab of another page size, what
            # the budget leaves), over the rank's disks; retired: pages still held in its slabs of other page sizes.
            "slots": {k.label: {"used": sum(st.pool.used for st in grp.parts),
                                "total": sum(st.pool.limit for st in grp.parts),
                                "retired": sum(len(r.lru.current) for st in grp.parts for r in tuple(st.retired))}
                      for k, grp in kinds},
            # Per disk of the rank: durable pages, slots, write failures and shed pages (writer.disk_stats), misses
            # from read errors there: a slow or failing drive shows here, and only there.
            "per_disk": self._per_disk(),
            "cold_start_other_namespace_pages": self.other_namespace_pages,  # kept by `load`, of other models
            "inflight": inflight,
            "max_inflight": self.config.max_inflight,
            "reload_inflight": self._reloader.inflight,
            "write_queue_depth": qdepth,
            **self._writer.stats(),
            # Acknowledged by spill (write-behind) and not yet durable: what a crash right now would lose.
            # Bounded by the staging cap (queues.staging_bytes / max_inflight); 0 under ack = "durable".
            "acked_not_durable_pages": self._staged.acked_pages,
            "acked_not_durable_bytes": self._staged.acked_bytes,
            "acked_not_durable_oldest_s": self._staged.oldest_acked_age(),
            "staging_bytes": self._staging.in_use,
            "staging_allocated_bytes": self._staging.allocated,
            "staging_peak_bytes": self._staging.peak_allocated,
            "staging_cap_bytes": self._staging.cap,
        }
        out.update(self.c.flat())
        out["index_full"] += self.index.index_full if self.index else 0
        out["index_write_errors"] = self.index.write_errors if self.index else 0
        out["index_stale_readers_cleared"] = self.index.stale_readers_cleared if self.index else 0
        out["index_damage_seen"] = self.index.damage_seen if self.index else 0
        # The guard's verdict at this process's first open of the index (engine/index_check.py): "verified", "new",
        # "in_use" (another process of the node opened it first), "salvaged" or "reset" (it was damaged: moved
        # aside to index_moved_to, the new index keeps index_salvage_kept of the index_salvage_claimed entries).
        v = self.index.verdict if self.index else None
        out["index_check"] = v.action if v else None
        out["index_repaired"] = int(bool(v and v.repaired))
        out["index_salvage_kept"] = v.kept if v and v.repaired else None
        out["index_salvage_claimed"] = v.claimed if v and v.repaired else None
        out["index_moved_to"] = v.moved_to if v and v.repaired else None
        return out

    def close(self, timeout: float = 30.0) -> None:
        if self._closed:
            return
        self.flush(timeout)
        with self._staged.cond:
            self._closed = True
            self._staged.cond.notify_all()  # a spill waiting for room gives up now
        self._writer.stop(timeout)
        self._reloader.shutdown()
        self._staging.close()
        self._close_files()

    def _per_disk(self) -> dict:
        out = self._writer.disk_stats()
        for d, row in out.items():
            row["read_errors"] = self.c.disk_read_errors.get(d, 0)
        return out

    def _close_files(self) -> None:
        for grp in self._kinds.values():
            for st in grp.parts:
                slab_set.close_kind(st)
        if self._reloader is not None:
            self._reloader.close_readers()
        if self.index is not None:
            self.index.close()
            self.index = None
        if self._owner is not None:  # last: nothing of this rank is open any more
            self._owner.release()
            self._owner = None

    @property
    def closed(self) -> bool:
        return self._closed

    def incompatibility(self, config: L3Config, namespace: Namespace, kinds: Mapping[PayloadKind, int]) -> str:
        """'' when an opener asking for (config, namespace, kinds) can share this store, else what differs (both
        sides named). Kinds this store has and the opener does not ask for are fine; kinds it lacks are added
        (``add_kind``) by :meth:`L3Store.open`."""
        if config != self.config:
            diff = [f"{f.name} {getattr(self.config, f.name)!r} vs {getattr(config, f.name)!r}"
                    for f in dataclasses.fields(L3Config) if f.compare
                    and getattr(self.config, f.name) != getattr(config, f.name)]
            return (f"another config ({self.config.source} vs {config.source}: {'; '.join(diff)})")
        ns = namespace.digest_for(config.deployment_id)
        if ns != self.ns:
            return f"another namespace (digest {self.ns.hex()} open, {ns.hex()} asked; {self.namespace} vs {namespace})"
        have = {k: st.page_bytes for k, st in list(self._kinds.items())}
        if any(k in have and have[k] != n for k, n in kinds.items()):
            return f"other payload kinds (open: {_kinds_text(have)}; asked: {_kinds_text(kinds)})"
        return ""


def _kinds_text(kinds: Mapping[PayloadKind, int]) -> str:
    return ", ".join(f"{k.label}={n} B" for k, n in sorted(kinds.items()))


# (owner lock path: index, deployment, rank) -> this process's SharedStore there. Open, share and the last close
# happen under _OPEN_LOCK, so an open never races a close of the same store.
_OPEN: dict[str, SharedStore] = {}
_OPEN_LOCK = threading.Lock()


class L3Store:
    """A handle onto this process's one store of (index, deployment, rank): what callers hold. Build with
    :meth:`open`; close each handle once (closing it again does nothing). Every handle of a store sees the same
    pages, counters and cold start; ``clear`` through any handle clears that one shared cache. After a handle is
    closed its data-path calls are misses and dropped writes (never exceptions), whatever other handles do."""

    __slots__ = ("_shared", "_closed")

    def __init__(self, shared: SharedStore):
        self._shared = shared
        self._closed = False

    # ------------------------------------------------------------------ open / find / close
    @classmethod
    def open(cls, config: L3Config, *, rank: int, namespace: Namespace,
             page_bytes: Mapping[PayloadKind | str, int], cold_start: str | None = None) -> "L3Store":
        """A handle onto this rank's store. The first open in this process takes the owner lock, opens the slabs,
        checks PLP, opens the index, applies the cold-start policy and starts the writer; a later open of the same
        (index, deployment, rank) joins that store (its ``cold_start`` is not applied again) if it asks for the
        same config and namespace and the same page size for every kind both know (a kind the store lacks is
        added, where the config's budget rule can size it alone), and is refused with
        ``L3OwnerLockedError.in_this_process`` naming both sides otherwise. Another live process owning it is refused as ever
        (``in_this_process=False``). Every failure here is loud (:class:`L3StoreError` / :class:`L3ConfigError`).
        ``cold_start`` overrides the config's mode (tests and tools; the config already carries
        SGLANG_CP_L3_COLD_START)."""
        if not isinstance(config, L3Config):
            raise L3ConfigError(f"<config>: expected L3Config, got {type(config).__name__}")
        config.check_rank(rank)
        if not isinstance(namespace, Namespace):
            raise L3ConfigError(f"namespace: expected format.Namespace, got {type(namespace).__name__}")
        kinds = _parse_kinds(page_bytes)
        path = OwnerLock.path_for(config.index_path, config.deployment_id, rank)
        with _OPEN_LOCK:
            shared = _OPEN.get(path)
            if shared is None:
                shared = SharedStore(config, rank=rank, namespace=namespace, page_bytes=kinds, cold_start=cold_start)
                _OPEN[path] = shared
            else:
                why = shared.incompatibility(config, namespace, kinds)
                if not why:
                    try:
                        for k, n in kinds.items():
                            shared.add_kind(k, n)  # a no-op for the kinds it has
                    except (L3ConfigError, L3StoreError) as e:
                        have = {k: st.page_bytes for k, st in list(shared._kinds.items())}
                        why = f"other payload kinds (open: {_kinds_text(have)}; asked: {_kinds_text(kinds)}): {e}"
                if why:
                    raise L3OwnerLockedError(
                        f"deployment {config.deployment_id!r} rank {rank} on the L3 index {config.index_path!r} is "
                        f"open in this process with {why}; one store per (index, deployment, rank) per process: "
                        "open it with the same config, namespace and payload kinds to share it, or give the "
                        "other cache its own deployment_id",
                        holder={"pid": os.getpid(), "slab_dir": shared.config.slab_dir(rank)}, in_this_process=True)
            shared.refs += 1
            return cls(shared)

    @classmethod
    def find_open(cls, config: L3Config, rank: int) -> "SharedStore | None":
        """The store this process has open for (config's index, deployment, rank), or None. For inspection: it
        takes no reference (a user of the store opens its own handle with :meth:`open`)."""
        with _OPEN_LOCK:
            return _OPEN.get(OwnerLock.path_for(config.index_path, config.deployment_id, rank))

    def close(self, timeout: float = 30.0) -> None:
        """Drop this handle's reference, once; the last one flushes and closes the store (its slab, owner and index
        locks are released)."""
        with _OPEN_LOCK:
            if self._closed:
                return
            self._closed = True
            shared = self._shared
            shared.refs -= 1
            if shared.refs > 0:
                return
            if _OPEN.get(shared.owner_path) is shared:
                del _OPEN[shared.owner_path]
            shared.close(timeout)

    @property
    def shared(self) -> SharedStore:
        return self._shared

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> "L3Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getattr__(self, name: str):
        # Diagnostics and tests read the store's own state (config, rank, namespace, index, counters...).
        return getattr(self._shared, name)

    # ------------------------------------------------------------------ the caller API (SharedStore documents it)
    def spill(self, kind, keys: Sequence, pages: Sequence, *, wait: float = 0.0, durable: bool = False) -> list[bool]:
        return _dropped(keys) if self._closed else self._shared.spill(kind, keys, pages, wait=wait, durable=durable)

    def spill_from_layout(self, kind, keys: Sequence, layout, page_indices: Sequence[int], *, wait: float = 0.0,
                          durable: bool = False) -> list[bool]:
        return _dropped(keys) if self._closed else self._shared.spill_from_layout(kind, keys, layout, page_indices,
                                                                                   wait=wait, durable=durable)

    def wait_durable(self, kind, keys: Sequence, timeout: float) -> list[bool]:
        return _dropped(keys) if self._closed else self._shared.wait_durable(kind, keys, timeout)

    def exists(self, kind, keys: Sequence, *, include_staged: bool = True) -> int:
        return 0 if self._closed else self._shared.exists(kind, keys, include_staged=include_staged)

    def reload_into(self, kind, keys: Sequence, dsts: Sequence) -> list[bool]:
        return _dropped(keys) if self._closed else self._shared.reload_into(kind, keys, dsts)

    def reload_into_layout(self, kind, keys: Sequence, layout, page_indices: Sequence[int]) -> list[bool]:
        return _dropped(keys) if self._closed else self._shared.reload_into_layout(kind, keys, layout, page_indices)

    def free(self, kind, keys: Sequence) -> None:
        if not self._closed:
            self._shared.free(kind, keys)

    def clear(self, timeout: float = 60.0) -> bool:
        return False if self._closed else self._shared.clear(timeout)

    def flush(self, timeout: float | None = 30.0) -> bool:
        return False if self._closed else self._shared.flush(timeout)

    def stats(self) -> dict:
        return self._shared.stats()

    def slab(self, kind, disk: "int | None" = None) -> Any:
        return self._shared.slab(kind, disk)

    def locate(self, kind, key) -> "tuple[int, int, int] | None":
        return self._shared.locate(kind, key)

    def add_kind(self, kind, page_bytes: int, timeout: float = 30.0) -> None:
        if self._closed:
            raise L3StoreError("this L3Store handle is closed")
        self._shared.add_kind(kind, page_bytes, timeout)


def _dropped(keys) -> list[bool]:
    """What a closed handle answers: one False per key (a dropped write or a miss), never an exception."""
    try:
        return [False] * len(list(keys))
    except TypeError:
        return []
