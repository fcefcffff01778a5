"""Cold start: what a store keeps of this (deployment, rank)'s index entries when it opens, before its writer
thread exists (so it alone touches the pools and LRUs here).

* ``clear`` (default): delete every entry of this deployment and rank (all namespaces); pools start empty; the
  blobs on disk are inert and overwritten lazily. Other ranks' and other deployments' entries are untouched.
* ``load``: rebuild the slot pools and LRUs from the index entries alone -- one scan of the deployment's key
  range, no slab read -- so it costs O(entries), whatever the page size and the disk (seconds per million pages,
  not one 4 KiB read per page). A load keeps every entry of this rank it can prove valid, WHATEVER ITS NAMESPACE
  (two models taking turns on one L3 directory no longer evict each other at every restart): an
  entry is kept if the slab it names is one this build may keep (see below), it names this rank's disk and a slot
  in range, and no newer entry names the same slot. Entries of this slab's other namespaces occupy their slots and
  join the same GC LRU (coldest first, any namespace); only ``clear`` and GC remove them. Every other entry of
  this rank is deleted before the writer starts. So the entries that name this rank's slabs are exactly the
  allocated slots (l3_design.md, crash-safety point 3). A kind the store adds after open (``add_kind``: SGLang's
  sidecar draft pools) gets the same rule from :func:`load_kind` before the writer takes its pool over; entries
  of a kind this store does not open are left alone (nobody writes that kind's slab meanwhile).

Which slab an entry names: an index entry says (rank, disk, slot), not a file. A kind has one slab per slot size
(slab_set.py): the slab of this store's page size, and any of other page sizes beside it (retired). An entry of this
store's namespace names its own slab (one namespace, one page size); another namespace's entry names the slab whose
sidecar lists that namespace (``KindState.slab_of``), this slab if it is the kind's only one; an entry that cannot
be placed (several slabs, none lists it) is dropped. Kept entries of a retired slab join its own LRU (no pool:
nothing is written there).

Why no slab read is needed: an entry is committed only after its payload's fdatasync (and reclaim deletes the
entry before the slot is reused), so a kept entry names a slot that held its page when the index said so; and every
reload verifies header and payload checksum over the bytes it read, so a slot whose bytes were lost since (a disk
without PLP, bit rot) is a miss that reclaims its entry at the first read, never wrong bytes. A slot written but
never committed has no entry, so it is free again. ``fsck`` still reads every referenced blob.

A slab's entries are all dropped (its pages become misses, its slots free) when its previous sidecar does not
show a slab of this format and geometry: it was created by this open, it has no sidecar, the sidecar names an
older format version (v1 blobs: the upgrade policy in l3_format.md) or another slot size, or a slot count the file
did not have (a budget change resizes the file in place and keeps the slots that remain: same slot size, same
boundaries). The page size in the sidecar is the last owner's and says nothing about other namespaces' blobs.

Several disks per rank: each (kind, disk) slab is a slab of its own here -- its own sidecar verdict, slots and LRU.
An entry goes to the state of the disk it names (``KindDisks.on``); one that names a disk this rank no longer
writes (the mapping changed) goes to the home disk's, where the disk check of :func:`_keep` drops it as stale, as a
one-disk rank always did.

The stale drop matches on location only: this store owns (deployment, rank) and its writer does not exist yet, so
nobody else can have written an entry naming its slots, and a touch must not save a stale entry.
"""

from __future__ import annotations

import contextlib
import gc
import logging
from dataclasses import dataclass
from typing import Collection, Mapping

import numpy as np

from ..errors import L3StoreError
from ..disk.format import FORMAT_VERSION, PayloadKind
from .index import IndexEntry, KeySpace, L3Index, namespace_and_kind
from .kinds import KindDisks, KindState

__all__ = ["ColdStart", "apply", "load_kind", "slab_verdict"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ColdStart:
    mode: str
    loaded_pages: int  # entries of this store's namespace kept (load): pages it serves
    stale_dropped: int  # entries of this rank deleted because they cannot name a live page of this store (load)
    discarded: tuple = ()  # (kind label, why) for each slab whose entries were all dropped (load)
    other_pages: int = 0  # entries of other namespaces kept (load): other models' pages, in this rank's slabs


def slab_verdict(st: KindState, meta: "dict | None") -> "str | None":
    """None if the entries naming this slab may be kept, else why not (the slab's previous sidecar ``meta``, read
    before this open rewrote it, is the only record of what wrote its blobs)."""
    if getattr(st.slab, "created", False):
        return "the slab file was created by this open"
    if not isinstance(meta, dict):
        return "the slab has no sidecar"
    if meta.get("format_version") != FORMAT_VERSION:
        return f"its blobs are format v{meta.get('format_version')}, this build serves v{FORMAT_VERSION}"
    if meta.get("slot_bytes") != st.slot_bytes:
        return f"its sidecar says slot_bytes={meta.get('slot_bytes')!r}, this store uses {st.slot_bytes}"
    n = meta.get("num_slots")
    if n != st.num_slots and n != getattr(st.slab, "resized_from", None):
        return f"its sidecar says num_slots={n!r}, the file had {getattr(st.slab, 'resized_from', None) or st.num_slots}"
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


def apply(mode: str, index: L3Index, keys: KeySpace, rank: int,
          kinds: Mapping[PayloadKind, KindDisks], prior_meta: Mapping[tuple[PayloadKind, int], "dict | None"],
          deferred: Collection[PayloadKind] = ()) -> ColdStart:
    """``prior_meta``: each open (kind, disk) slab's sidecar as the previous owner left it (read before this open
    rewrote it). ``deferred``: kinds the config sizes on its own that are not open yet (``load`` leaves their entries
    for :func:`load_kind`, run when the store adds the kind)."""
    with _no_cyclic_gc():
        return _apply(mode, index, keys, rank, kinds, prior_meta, deferred)


def _apply(mode, index, keys, rank, kinds, prior_meta, deferred) -> ColdStart:
    if mode == "clear":
        index.delete_for(keys.deployment, rank)  # every namespace and disk; by position if the index is damaged
        for grp in kinds.values():
            for st in grp.parts:
                st.pool.reset()
        return ColdStart(mode, 0, 0)
    # One scan of the deployment's range (every namespace), not a key search per entry: a damaged key must neither
    # end the walk nor hide the entries after it.
    scan = index.scan(keys.deployment)
    done = _place(scan.items, keys, rank, kinds, prior_meta, deferred)
    return _commit(index, scan, done)


def _place(items, keys: KeySpace, rank: int, kinds, prior_meta, deferred, only=None) -> "_Placed":
    """Sort this rank's entries onto their slabs and keep what may be kept (module docstring). ``only``: one kind."""
    # This store's own keys by their KeySpace prefix: one slice and one dict lookup per entry (the load's cost is
    # this loop, so it stays O(1) per entry and allocation-free for other ranks' entries).
    ours = {keys.prefix(k): k for k in PayloadKind}
    plen = len(next(iter(ours)))
    own = keys.namespace
    placed = _Placed()
    per_slab: dict[int, tuple] = {}
    for item in items:
        if item[1].rank != rank:
            continue
        kind = ours.get(item[0][:plen])
        ns = own
        if kind is None:
            ns, kb = namespace_and_kind(item[0])
            kind = PayloadKind.from_byte(kb)
            if kind is None:  # a kind byte no build defines (a damaged key): no slab can hold it
                placed.stale.append(item)
                continue
        if only is not None and kind is not only:
            continue
        grp = kinds.get(kind)
        if grp is None:
            continue  # a kind this store does not open (yet): nobody writes its slab meanwhile, its entries stay
        st = grp.on(item[1].disk) or grp.home  # another disk than this rank's: _keep finds it stale
        target = st.slab_of(ns, own)
        if target is None:
            placed.stale.append(item)  # several slabs of the kind and no sidecar lists its namespace
            continue
        per_slab.setdefault(id(target), (st, target, []))[2].append(item)
    for st, target, its in per_slab.values():
        if target is st:
            why = slab_verdict(st, prior_meta.get((st.kind, st.disk)))
            if why is not None:
                _discard(st.kind, its, why, rank, placed.stale, placed.discarded)
                continue
            best = _keep(st.num_slots, its, st.disk, placed.stale)
            st.pool.rebuild_from_allocated(np.fromiter(best, dtype=np.int64, count=len(best)))
            st.lru.load([(key, e.last_access, slot) for slot, (key, e) in best.items()])
        else:
            if not target.usable:
                _discard(st.kind, its, f"its slab {target.path} cannot be vouched for", rank, placed.stale,
                         placed.discarded)
                continue
            best = _keep(target.num_slots, its, st.disk, placed.stale)
            target.lru.load([(key, e.last_access, slot) for slot, (key, e) in best.items()])
        mine = sum(1 for key, _ in best.values() if key[:plen] in ours)
        placed.loaded += mine
        placed.other += len(best) - mine
    return placed


class _Placed:
    __slots__ = ("stale", "discarded", "loaded", "other")

    def __init__(self):
        self.stale: list[tuple[bytes, IndexEntry]] = []
        self.discarded: list = []
        self.loaded = 0
        self.other = 0


def _commit(index, scan, placed: "_Placed") -> ColdStart:
    # Stale entries point at slots this rank may now hand out: remove them before any write can happen.
    if placed.stale and index.delete_scanned(placed.stale, damaged=bool(scan.damaged)) is None:
        raise L3StoreError(f"index refused to drop stale entries ({index.last_refusal or 'map full'}); enlarge "
                           "index.map_size or free space on the index's file system")
    return ColdStart("load", placed.loaded, len(placed.stale), tuple(placed.discarded), placed.other)


def load_kind(index: L3Index, keys: KeySpace, rank: int, grp: KindDisks,
              prior_meta: Mapping[tuple[PayloadKind, int], "dict | None"]) -> ColdStart:
    """``load`` for one kind a store adds after open, before the writer owns its pools: the same rule as
    :func:`apply` (index entries alone, no slab read; a slab it cannot vouch for keeps none), over this rank's
    entries of that kind only, every namespace and disk (nobody else writes this rank's slabs of it)."""
    with _no_cyclic_gc():
        scan = index.scan(keys.deployment)
        done = _place(scan.items, keys, rank, {grp.kind: grp}, prior_meta, (), only=grp.kind)
        return _commit(index, scan, done)


def _discard(kind: PayloadKind, items: list, why: str, rank: int, stale: list, discarded: list) -> None:
    stale.extend(items)  # not ours to keep: its slots are (or become) this store's free slots
    discarded.append((kind.label, why))
    log.info("L3 cold start (load), rank %d: dropping %d entries of %s: %s", rank, len(items), kind.label, why)


def _keep(num_slots: int, items: list, disk: int, stale: list) -> "dict[int, tuple[bytes, IndexEntry]]":
    """The slots a slab's entries name (on this rank's disk, in range, one entry per slot: the newest commit wins,
    since a slot is rewritten only after its older entry's delete committed, so a duplicate is a delete that never
    landed; verify-on-read covers the rest): slot -> (key, entry). Every other entry goes to ``stale``."""
    best: dict[int, tuple[bytes, IndexEntry]] = {}
    for item in items:
        e = item[1]
        if e.disk != disk or not 0 <= e.slot < num_slots:
            stale.append(item)
            continue
        other = best.setdefault(e.slot, item)
        if other is not item:
            if e.last_access > other[1].last_access:
                stale.append(other)
                best[e.slot] = item
            else:
                stale.append(item)
    return best
