"""Cold start: what a store keeps of this (deployment, rank)'s index entries when it opens, before its writer
thread exists (so it alone touches the pools and LRUs here).

* ``clear`` (default): delete every entry of this deployment and rank (all namespaces); pools start empty; the
  blobs on disk are inert and overwritten lazily. Other ranks' and other deployments' entries are untouched.
* ``load``: rebuild the slot pools and LRUs from the index entries alone -- one scan of the deployment's key
  range, no slab read -- so it costs O(entries), whatever the page size and the disk (seconds per million pages,
  not one 4 KiB read per page). An entry of this rank and namespace is kept if its slab is one this build may keep
  (see below), it names this rank's disk and a slot in range, and no newer entry names the same slot; every other
  entry of this rank is deleted before the writer starts. So the entries that name this rank's slabs are exactly
  the allocated slots (l3_design.md, crash-safety point 3). A kind the store adds after open (``add_kind``:
  SGLang's sidecar draft pools) gets the same rule from :func:`load_kind` before the writer takes its pool over.

Why no slab read is needed: an entry is committed only after its payload's fdatasync (and reclaim deletes the
entry before the slot is reused), so a kept entry names a slot that held its page when the index said so; and every
reload verifies header and payload checksum over the bytes it read, so a slot whose bytes were lost since (a disk
without PLP, bit rot) is a miss that reclaims its entry at the first read, never wrong bytes. A slot written but
never committed has no entry, so it is free again. ``fsck`` still reads every referenced blob.

A slab's entries are all dropped (its pages become misses, its slots free) when its previous sidecar does not
show a slab of this format and geometry: it was created by this open, it has no sidecar, the sidecar names an
older format version (v1 blobs: the upgrade policy in l3_format.md) or other slot or page sizes.

Either way, entries of this deployment+rank under ANOTHER namespace are dropped: the rank's slabs are reused by the
current namespace, so such entries would point at slots this process will hand out. The stale drop matches on
location only: this store owns (deployment, rank) and its writer does not exist yet, so nobody else can have
written an entry naming its slots, and a touch must not save a stale entry.
"""

from __future__ import annotations

import contextlib
import gc
import logging
from dataclasses import dataclass
from typing import Collection, Mapping

import numpy as np

from .errors import L3StoreError
from .format import FORMAT_VERSION, PayloadKind
from .index import IndexEntry, KeySpace, L3Index
from .kinds import KindState

__all__ = ["ColdStart", "apply", "load_kind", "slab_verdict"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ColdStart:
    mode: str
    loaded_pages: int  # entries kept (load)
    stale_dropped: int  # entries of this rank deleted because they cannot name a live page of this store (load)
    discarded: tuple = ()  # (kind label, why) for each slab whose entries were all dropped (load)


def slab_verdict(st: KindState, meta: "dict | None") -> "str | None":
    """None if the entries naming this slab may be kept, else why not (the slab's previous sidecar ``meta``, read
    before this open rewrote it, is the only record of what wrote its blobs)."""
    if getattr(st.slab, "created", False):
        return "the slab file was created by this open"
    if not isinstance(meta, dict):
        return "the slab has no sidecar"
    if meta.get("format_version") != FORMAT_VERSION:
        return f"its blobs are format v{meta.get('format_version')}, this build serves v{FORMAT_VERSION}"
    for name, want in (("slot_bytes", st.slot_bytes), ("num_slots", st.num_slots), ("page_bytes", st.page_bytes)):
        if meta.get(name) != want:
            return f"its sidecar says {name}={meta.get(name)!r}, this store uses {want}"
    return None


@contextlib.contextmanager
def _no_cyclic_gc():
    """Python's cyclic GC paused while a load builds its per-entry tuples (restored as it was). A load allocates
    a few tuples per index entry, and the collector's full passes over that growing heap were ~70 % of the load's
    time (measured: 120k entries, 1.0 s -> 0.3 s). Nothing made here is cyclic: reference counting frees it."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def apply(mode: str, index: L3Index, keys: KeySpace, rank: int, disk: int,
          kinds: Mapping[PayloadKind, KindState], prior_meta: Mapping[PayloadKind, "dict | None"],
          deferred: Collection[PayloadKind] = ()) -> ColdStart:
    """``prior_meta``: each open kind's slab sidecar as the previous owner left it (read before this open rewrote
    it). ``deferred``: kinds the config sizes on its own that are not open yet (``load`` leaves their entries for
    :func:`load_kind`, run when the store adds the kind)."""
    with _no_cyclic_gc():
        return _apply(mode, index, keys, rank, disk, kinds, prior_meta, deferred)


def _apply(mode, index, keys, rank, disk, kinds, prior_meta, deferred) -> ColdStart:
    if mode == "clear":
        index.delete_for(keys.deployment, rank)  # every namespace; by position if the index is damaged
        for st in kinds.values():
            st.pool.reset()
        return ColdStart(mode, 0, 0)
    # One scan of the deployment's range (every namespace), not a key search per entry: a damaged key must neither
    # end the walk nor hide the entries after it.
    scan = index.scan(keys.deployment)
    # Which (namespace, kind) a key belongs to, by its KeySpace prefix: one slice and one dict lookup per entry
    # (the load's cost is this loop, so it stays O(1) per entry and allocation-free for other ranks' entries).
    ours = {keys.prefix(k): k for k in PayloadKind}
    plen = len(next(iter(ours)))
    stale: list[tuple[bytes, IndexEntry]] = []
    by_kind: dict[PayloadKind, list[tuple[bytes, IndexEntry]]] = {}
    for item in scan.items:
        if item[1].rank != rank:
            continue
        kind = ours.get(item[0][:plen])
        if kind is None:  # another namespace of this deployment: its slots are this store's now
            stale.append(item)
        else:
            by_kind.setdefault(kind, []).append(item)
    loaded, discarded = 0, []
    for kind, items in by_kind.items():
        st = kinds.get(kind)
        if st is None and kind in deferred:
            continue  # load_kind decides when the store adds the kind (nobody writes its slab until then)
        why = "a kind this store does not serve" if st is None else slab_verdict(st, prior_meta.get(kind))
        if why is not None:
            _discard(kind, items, why, rank, stale, discarded)
            continue
        loaded += _keep(st, items, disk, stale)
    # Stale entries point at slots this rank may now hand out: remove them before any write can happen.
    if stale and index.delete_scanned(stale, damaged=bool(scan.damaged)) is None:
        raise L3StoreError("index map full while dropping stale entries; enlarge index.map_size")
    return ColdStart(mode, loaded, len(stale), tuple(discarded))


def load_kind(index: L3Index, keys: KeySpace, rank: int, disk: int, st: KindState,
              prior_meta: "dict | None") -> ColdStart:
    """``load`` for one kind a store adds after open, before the writer owns its pool: the same rule as
    :func:`apply` (index entries alone, no slab read; a slab it cannot vouch for keeps none), over this rank's
    entries of that kind only (nobody else writes this rank's slab of it)."""
    with _no_cyclic_gc():
        return _load_kind(index, keys, rank, disk, st, prior_meta)


def _load_kind(index, keys, rank, disk, st, prior_meta) -> ColdStart:
    scan = index.scan(keys.prefix(st.kind))
    items = [item for item in scan.items if item[1].rank == rank]
    stale: list[tuple[bytes, IndexEntry]] = []
    discarded: list = []
    loaded = 0
    why = slab_verdict(st, prior_meta) if items else None
    if why is not None:
        _discard(st.kind, items, why, rank, stale, discarded)
    else:
        loaded = _keep(st, items, disk, stale)
    if stale and index.delete_scanned(stale, damaged=bool(scan.damaged)) is None:
        raise L3StoreError("index map full while dropping stale entries; enlarge index.map_size")
    return ColdStart("load", loaded, len(stale), tuple(discarded))


def _discard(kind: PayloadKind, items: list, why: str, rank: int, stale: list, discarded: list) -> None:
    stale.extend(items)  # not ours to keep: its slots are (or become) this store's free slots
    discarded.append((kind.label, why))
    log.info("L3 cold start (load), rank %d: dropping %d entries of %s: %s", rank, len(items), kind.label, why)


def _keep(st: KindState, items: list, disk: int, stale: list) -> int:
    """Occupy exactly the slots this kind's entries name (on this rank's disk, in range, one entry per slot: the
    newest commit wins, since a slot is rewritten only after its older entry's delete committed, so a duplicate is
    a delete that never landed; verify-on-read covers the rest); append every other entry to ``stale``."""
    best: dict[int, tuple[bytes, IndexEntry]] = {}
    n = st.num_slots
    for item in items:
        e = item[1]
        if e.disk != disk or not 0 <= e.slot < n:
            stale.append(item)
            continue
        other = best.setdefault(e.slot, item)
        if other is not item:
            if e.last_access > other[1].last_access:
                stale.append(other)
                best[e.slot] = item
            else:
                stale.append(item)
    st.pool.rebuild_from_allocated(np.fromiter(best, dtype=np.int64, count=len(best)))
    st.lru.load([(key, e.last_access, slot) for slot, (key, e) in best.items()])
    return len(best)
