"""L3Store: the durable disk tier for one rank, as its callers see it: spill, exists, reload, free, clear, flush.

Who owns what (the full table, and a page's path from ``spill`` to the slab and back: docs_internal/l3_design.md):

* Caller threads (the scheduler / HiCache I/O threads) call the methods below. Each call decides once, up front,
  what the call needs (plan: the payload kind, the keys, which pages are present, which destinations can take
  their page in place), then runs with no decision left. ``spill`` only copies into staging (staging.py) and
  queues; it never touches a slot pool and never blocks on the disk. ``reload`` reads straight into the caller's
  memory and verifies the bytes there (reload.py), on the caller's thread plus a small read pool.
* ONE writer thread (writer.py) owns every slot pool and page LRU; its committer thread (committer.py) makes
  batches durable; every reclaim (reclaim.py) deletes the index entry before the slot is reused.
* ``open`` wires them, in this order (lifecycle.py): owner lock -> slab directories -> PLP -> slabs + sidecars ->
  index -> cold start (coldstart.py, before the writer exists) -> staging, readers, writer.
* This file is the handle callers hold and the process's table of open stores; the store itself is
  ``SharedStore`` (shared.py), its long calls in rooms of one concern (lifecycle.py, spill.py, stats.py) and what
  tools and tests may read of its insides in diagnostics.py. ``SURFACE`` lists the handle's whole public face.
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

import os
import threading
from typing import Any, Sequence

from ..config import L3Config, L3ConfigError
from ..disk.format import Namespace, PayloadKind
from ..disk.owner_lock import OwnerLock
from ..disk.slab import slow_write
from ..disk.slab_dir import slab_path  # noqa: F401 - re-exported: tests name a kind's slab file through the store
from ..errors import L3OwnerLockedError, L3StoreError
from .diagnostics import Diagnostics
from .lifecycle import kinds_text, page_sizes, parse_kinds
from .shared import SharedStore, dropped

__all__ = ["L3Store", "SharedStore", "L3StoreError", "L3OwnerLockedError", "SURFACE", "slab_path"]

# (owner lock path: index, deployment, rank) -> this process's SharedStore there. Open, share and the last close
# happen under _OPEN_LOCK, so an open never races a close of the same store.
_OPEN: dict[str, SharedStore] = {}
_OPEN_LOCK = threading.Lock()


def _of_shared(name: str, doc: str) -> property:
    return property(lambda self: getattr(self._shared, name), doc=doc)


class L3Store:
    """A handle onto this process's one store of (index, deployment, rank): what callers hold. Build with
    :meth:`open`; close each handle once (closing it again does nothing). Every handle of a store sees the same
    pages, counters and cold start; ``clear`` through any handle clears that one shared cache. After a handle is
    closed its data-path calls are misses and dropped writes (never exceptions), whatever other handles do.
    Everything else a handle offers is listed in ``SURFACE``; the insides are read through :meth:`diagnostics`."""

    __slots__ = ("_shared", "_closed")

    def __init__(self, shared: SharedStore):
        self._shared = shared
        self._closed = False

    # ------------------------------------------------------------------ open / find / close
    @classmethod
    def open(cls, config: L3Config, *, rank: int, namespace: Namespace,
             page_bytes: "dict[PayloadKind | str, int]", cold_start: str | None = None) -> "L3Store":
        """A handle onto this rank's store. The first open in this process takes the owner lock, opens the slabs,
        checks PLP, opens the index, applies the cold-start policy and starts the writer; a later open of the same
        (index, deployment, rank) joins that store (its ``cold_start`` is not applied again) if it asks for the
        same config and namespace and the same page size for every kind both know (a kind the store lacks is
        added, where the config's budget rule can size it alone), and is refused with
        ``L3OwnerLockedError.in_this_process`` naming both sides otherwise. Another live process owning it is
        refused as ever (``in_this_process=False``). Every failure here is loud (:class:`L3StoreError` /
        :class:`L3ConfigError`). ``cold_start`` overrides the config's mode (tests and tools; the config already
        carries SGLANG_CP_L3_COLD_START)."""
        if not isinstance(config, L3Config):
            raise L3ConfigError(f"<config>: expected L3Config, got {type(config).__name__}")
        config.check_rank(rank)
        if not isinstance(namespace, Namespace):
            raise L3ConfigError(f"namespace: expected format.Namespace, got {type(namespace).__name__}")
        kinds = parse_kinds(page_bytes)
        path = OwnerLock.path_for(config.index_path, config.deployment_id, rank)
        with _OPEN_LOCK:
            shared = _OPEN.get(path)
            if shared is None:
                # slow_write is read here, at each first open: the seam a test replaces (test_store_slow_disk.py).
                shared = SharedStore(config, rank=rank, namespace=namespace, page_bytes=kinds, cold_start=cold_start,
                                     slow_write=slow_write)
                _OPEN[path] = shared
            else:
                _join(shared, config, rank, namespace, kinds)
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
        """The one store this handle points at (shared by every handle of it: ``refs``, ``closed``)."""
        return self._shared

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> "L3Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def add_kind(self, kind, page_bytes: int, timeout: float = 30.0) -> None:
        if self._closed:
            raise L3StoreError("this L3Store handle is closed")
        self._shared.add_kind(kind, page_bytes, timeout)

    # ------------------------------------------------------------------ the caller API (SharedStore documents it)
    def spill(self, kind, keys: Sequence, pages: Sequence, *, wait: float = 0.0, durable: bool = False) -> list[bool]:
        return dropped(keys) if self._closed else self._shared.spill(kind, keys, pages, wait=wait, durable=durable)

    def spill_from_layout(self, kind, keys: Sequence, layout, page_indices: Sequence[int], *, wait: float = 0.0,
                          durable: bool = False) -> list[bool]:
        return dropped(keys) if self._closed else self._shared.spill_from_layout(kind, keys, layout, page_indices,
                                                                                  wait=wait, durable=durable)

    def wait_durable(self, kind, keys: Sequence, timeout: float) -> list[bool]:
        return dropped(keys) if self._closed else self._shared.wait_durable(kind, keys, timeout)

    def exists(self, kind, keys: Sequence, *, include_staged: bool = True) -> int:
        return 0 if self._closed else self._shared.exists(kind, keys, include_staged=include_staged)

    def reload_into(self, kind, keys: Sequence, dsts: Sequence) -> list[bool]:
        return dropped(keys) if self._closed else self._shared.reload_into(kind, keys, dsts)

    def reload_into_layout(self, kind, keys: Sequence, layout, page_indices: Sequence[int]) -> list[bool]:
        return dropped(keys) if self._closed else self._shared.reload_into_layout(kind, keys, layout, page_indices)

    def free(self, kind, keys: Sequence) -> None:
        if not self._closed:
            self._shared.free(kind, keys)

    def clear(self, timeout: float = 60.0) -> bool:
        return False if self._closed else self._shared.clear(timeout)

    def flush(self, timeout: float | None = 30.0) -> bool:
        return False if self._closed else self._shared.flush(timeout)

    # ------------------------------------------------------------------ reports and tools
    def stats(self) -> dict:
        return self._shared.stats()

    def slab(self, kind, disk: "int | None" = None) -> Any:
        return self._shared.slab(kind, disk)

    def locate(self, kind, key) -> "tuple[int, int, int] | None":
        return self._shared.locate(kind, key)

    def diagnostics(self) -> Diagnostics:
        """What tools and tests may read of the store's insides (entries, I/O counters, alignment, slabs)."""
        return self._shared.diagnostics()

    # What the store was opened as and found at its cold start (read-only; the store's, shared by its handles).
    config = _of_shared("config", "The L3Config it was opened with.")
    rank = _of_shared("rank", "Its L3 rank.")
    namespace = _of_shared("namespace", "The Namespace it was opened with.")
    ns = _of_shared("ns", "The namespace digest (namespace AND deployment) every blob is sealed with.")
    dep = _of_shared("dep", "The deployment tag its index keys start with.")
    disk = _of_shared("disk", "Its home disk (the only one unless the rank mapping lists several).")
    disks = _of_shared("disks", "The disks it writes slabs on.")
    cold_start = _of_shared("cold_start", "The cold-start mode applied at its first open: 'clear' or 'load'.")
    plp = _of_shared("plp", "The home disk's power-loss protection verdict.")
    index = _of_shared("index", "Its L3Index (LMDB); None once the store is closed.")
    loaded_pages = _of_shared("loaded_pages", "Pages a 'load' cold start kept (0 after 'clear').")
    stale_dropped = _of_shared("stale_dropped", "Entries a 'load' deleted: they named no live page of it.")
    other_namespace_pages = _of_shared("other_namespace_pages", "Pages of other namespaces a 'load' kept.")


# The handle's whole face: what tools, benches and tests may read on an L3Store (tests/l3/engine/
# test_store_surface.py checks that they read nothing else). Private names are not on it, but for PENDING.
SURFACE = frozenset({
    "open", "find_open", "close", "closed", "shared", "add_kind",
    "spill", "spill_from_layout", "wait_durable", "exists", "reload_into", "reload_into_layout", "free", "clear",
    "flush", "stats", "slab", "locate", "diagnostics",
    "config", "rank", "namespace", "ns", "dep", "disk", "disks", "cold_start", "plp", "index", "loaded_pages",
    "stale_dropped", "other_namespace_pages",
})
# Private names still read, file by file, outside the files that own the store: may only shrink.
PENDING: dict[str, frozenset] = {}


def _join(shared: SharedStore, config: L3Config, rank: int, namespace: Namespace, kinds: dict) -> None:
    """A later open of an open store: shared if it asks for the same config, namespace and page sizes (a kind the
    store lacks is added), else refused naming both sides."""
    why = shared.incompatibility(config, namespace, kinds)
    if not why:
        try:
            for k, n in kinds.items():
                shared.add_kind(k, n)  # a no-op for the kinds it has
        except (L3ConfigError, L3StoreError) as e:
            why = f"other payload kinds (open: {kinds_text(page_sizes(shared))}; asked: {kinds_text(kinds)}): {e}"
    if why:
        raise L3OwnerLockedError(
            f"deployment {config.deployment_id!r} rank {rank} on the L3 index {config.index_path!r} is "
            f"open in this process with {why}; one store per (index, deployment, rank) per process: "
            "open it with the same config, namespace and payload kinds to share it, or give the "
            "other cache its own deployment_id",
            holder={"pid": os.getpid(), "slab_dir": shared.config.slab_dir(rank)}, in_this_process=True)
