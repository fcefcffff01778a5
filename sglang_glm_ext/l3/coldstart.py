"""Cold start: what a store keeps of this (deployment, rank)'s index entries when it opens, before its writer
thread exists (so it alone touches the pools and LRUs here).

* ``clear`` (default): delete every entry of this deployment and rank (all namespaces); pools start empty; the
  blobs on disk are inert and overwritten lazily. Other ranks' and other deployments' entries are untouched.
* ``load``: keep an entry only if its slot is in range and the slot header (one 4 KiB read) names the same kind,
  hash, namespace and payload length; occupy exactly the kept slots; delete every other entry of this rank. So the
  entries that name this rank's slabs are exactly the allocated slots (l3_design.md, crash-safety point 3).

Either way, entries of this deployment+rank under ANOTHER namespace are dropped: the rank's slabs are reused by the
current namespace, so such entries would point at slots this process will hand out. The stale drop matches on
location only: this store owns (deployment, rank) and its writer does not exist yet, so nobody else can have
written an entry naming its slots, and a touch must not save a stale entry.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Collection, Mapping

from .errors import L3StoreError
from .format import BlobHeader, PayloadKind, parse_header
from .index import IndexEntry, KeySpace, L3Index, split_key
from .kinds import KindState

__all__ = ["ColdStart", "apply"]


@dataclass(frozen=True)
class ColdStart:
    mode: str
    loaded_pages: int  # entries kept (load)
    stale_dropped: int  # entries of this rank deleted because their slot no longer holds the page (load)


def apply(mode: str, index: L3Index, keys: KeySpace, rank: int, disk: int,
          kinds: Mapping[PayloadKind, KindState], deferred: Collection[PayloadKind] = ()) -> ColdStart:
    """``deferred``: kinds the config sizes on its own that are not open yet (``load`` leaves their entries for
    :func:`load_kind`, run when the store adds the kind)."""
    if mode == "clear":
        index.delete_for(keys.deployment, rank)  # every namespace; by position if the index is damaged
        for st in kinds.values():
            st.pool.reset()
        return ColdStart(mode, 0, 0)
    index.delete_for(keys.deployment, rank, keep_ns=keys.namespace)
    loaded = 0
    # scan, not a key search per entry: a damaged key must neither end the walk nor hide the entries after it
    scan = index.scan(keys.deployment + keys.namespace)
    by_kind: dict[int, list[tuple[bytes, IndexEntry]]] = collections.defaultdict(list)
    for key, e in scan.items:
        if e.rank == rank:
            by_kind[split_key(key).kind].append((key, e))
    stale: list[tuple[bytes, IndexEntry]] = []
    for kind_byte, items in by_kind.items():
        kind = PayloadKind.from_byte(kind_byte)
        st = kinds.get(kind) if kind is not None else None
        if st is None:
            if kind not in deferred:
                stale.extend(items)  # a kind this process does not serve: its slab is not ours to keep
            continue
        loaded += _keep_verified(st, items, disk, keys, stale)
    # Stale entries point at slots this rank may now hand out: remove them before any write can happen.
    if stale and index.delete_scanned(stale, damaged=bool(scan.damaged)) is None:
        raise L3StoreError("index map full while dropping stale entries; enlarge index.map_size")
    return ColdStart(mode, loaded, len(stale))


def load_kind(index: L3Index, keys: KeySpace, rank: int, disk: int, st: KindState) -> ColdStart:
    """``load`` for one kind a store adds after open, before the writer owns its pool: keep this rank's entries of
    that kind whose slot header verifies, drop the others (nobody else writes this rank's slab of it)."""
    scan = index.scan(keys.prefix(st.kind))
    stale: list[tuple[bytes, IndexEntry]] = []
    loaded = _keep_verified(st, [(k, e) for k, e in scan.items if e.rank == rank], disk, keys, stale)
    if stale and index.delete_scanned(stale, damaged=bool(scan.damaged)) is None:
        raise L3StoreError("index map full while dropping stale entries; enlarge index.map_size")
    return ColdStart("load", loaded, len(stale))


def _keep_verified(st: KindState, items, disk: int, keys: KeySpace, stale: list) -> int:
    """Occupy exactly the slots whose header names the entry's page; append the other entries to ``stale``."""
    kept: list[tuple[bytes, int, int]] = []
    seen: set[int] = set()
    for key, e in items:
        ok = False
        if e.disk == disk and 0 <= e.slot < st.num_slots and e.slot not in seen:
            hdr = _read_header(st, e.slot)
            ok = (hdr is not None and hdr.kind == st.kind and hdr.content_hash == split_key(key).content_hash
                  and hdr.ns_digest == keys.namespace and hdr.payload_len == st.page_bytes)
        if ok:
            seen.add(e.slot)
            kept.append((key, e.last_access, e.slot))
        else:
            stale.append((key, e))
    st.pool.rebuild_from_allocated([slot for _, _, slot in kept])
    st.lru.load(kept)
    return len(kept)


def _read_header(st: KindState, slot: int) -> "BlobHeader | None":
    try:
        h = st.slab.read_header(slot)
    except Exception:
        return None
    if h is None or hasattr(h, "content_hash"):
        return h
    return parse_header(h)
