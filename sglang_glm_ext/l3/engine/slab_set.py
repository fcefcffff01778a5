"""A rank's slabs of one payload kind: the one it writes, and those of other slot sizes beside it.

One deployment and rank can meet several page sizes over time: a model upgrade (another layer count), or two models
taking turns on one L3 directory. Each slot size has its own file (``slab_dir.slab_path_for``); the store writes the
one of its own page size and keeps the others as :class:`~.kinds.RetiredSlab`: their pages stay valid for the model
that wrote them, GC reclaims them coldest-first together with this slab's pages, and the kind's share of the budget
is split between them -- this slab may use what the retired ones do not hold (``KindState.grant``), its capacity
grows as their pages are reclaimed (their freed slots are punched out of the files), and an emptied retired slab is
deleted. So the slabs of a kind never hold more than its share, and no file has to be deleted by hand.

A budget change at the same page size keeps the slot size, so the slab is resized in place (``DiskSlab.open``
``resize``): its slots keep their blobs, the cold start drops the entries of slots past a shrunk end.

Writer-thread only once the writer runs (like the pools); the store calls :func:`open_kind` and :func:`settle` at
open and in ``add_kind`` before the writer owns the kind.
"""

from __future__ import annotations

import logging
from typing import Iterator

from ..config import L3Config
from ..disk.slab import DiskSlab
from ..errors import L3StoreError, SlabError
from ..disk.format import FORMAT_VERSION, PayloadKind
from .kinds import KindState, PageLRU, RetiredSlab
from ..disk.slab_dir import (NAMESPACES_KEPT, check_slab_owner, kind_slabs, read_slab_meta, remove_slab, slab_namespaces, slab_path_for, write_slab_meta)
from .slot_pool import SlotPool

__all__ = ["open_kind", "settle", "close_kind"]

log = logging.getLogger(__name__)


def _direct(config: L3Config):
    return {"auto": "auto", "on": True, "off": False}[config.direct_io]


def _open_retired(config: L3Config, rank: int, path: str, seq: Iterator[int]) -> RetiredSlab:
    """A slab of another slot size, opened with the geometry its sidecar names (no preallocation: it keeps what it
    holds). One its sidecar cannot vouch for (none, another format version, a size that is not its geometry) is
    ``usable=False``: its entries are dropped and the file is removed."""
    meta = read_slab_meta(path)
    check_slab_owner(path, config.deployment_id, rank)
    sb = meta.get("slot_bytes") if isinstance(meta, dict) else None
    n = meta.get("num_slots") if isinstance(meta, dict) else None
    ok = (isinstance(sb, int) and isinstance(n, int) and not isinstance(sb, bool) and sb > 0 and n > 0
          and meta.get("format_version") == FORMAT_VERSION)
    slab = None
    if ok:
        try:
            slab = DiskSlab.open(path, slot_bytes=sb, num_slots=n, create=False, direct=_direct(config),
                                 prealloc_slots=0)
        except SlabError:
            ok = False
    return RetiredSlab(path, slab, sb if ok else 0, n if ok else 0, slab_namespaces(meta), PageLRU(seq), usable=ok)


def open_kind(config: L3Config, *, rank: int, disk: int, kind: PayloadKind, page_bytes: int, slot_bytes: int,
              num_slots: int, ns_digest: bytes, seq: Iterator[int]) -> "tuple[KindState, dict | None]":
    """This rank's slab of one kind on ``disk`` (created, resized to a new budget, or checked against its geometry),
    the slabs of other slot sizes beside it, and the slab's sidecar as the previous owner left it (read before it is
    rewritten here: a ``load`` cold start keeps a slab's entries only if it shows this format and geometry). Loud on
    failure (:class:`L3StoreError` / ``SlabError``); nothing it opened stays open then."""
    path = slab_path_for(config, rank, kind, slot_bytes, disk)
    retired: list[RetiredSlab] = []
    slab = None
    try:
        check_slab_owner(path, config.deployment_id, rank)  # before anything resizes a file
        for other in kind_slabs(config, rank, kind, disk):
            if other != path:
                retired.append(_open_retired(config, rank, other, seq))
        # Beside other slabs the capacity is settled after the cold start (settle): nothing is preallocated here.
        slab = DiskSlab.open(path, slot_bytes=slot_bytes, num_slots=num_slots, create=True, direct=_direct(config),
                             resize=True, prealloc_slots=0 if retired else None)
        prior = read_slab_meta(path)
        names = [h for h in ((prior or {}).get("namespaces") or []) if isinstance(h, str) and h != ns_digest.hex()]
        names = (names + [ns_digest.hex()])[-NAMESPACES_KEPT:]
        write_slab_meta(path, {
            "format_version": FORMAT_VERSION, "kind": kind.label, "slot_bytes": slot_bytes,
            "num_slots": num_slots, "page_bytes": page_bytes, "deployment_id": config.deployment_id,
            "rank": rank, "disk": disk, "ns_digest": ns_digest.hex(), "namespaces": names,
        })
    except BaseException:
        close_kind(None, slab, retired)
        raise
    pool = SlotPool(num_slots, limit=0 if retired else num_slots)
    state = KindState(kind, page_bytes, slot_bytes, num_slots, slab, pool, PageLRU(seq), retired=retired,
                      namespaces=slab_namespaces(prior) if not slab.created else set(), disk=disk)
    return state, prior


def settle(st: KindState, *, punch: bool = False) -> int:
    """Retired slabs that are empty or unusable are deleted; with ``punch`` (at open) the slots no entry names are
    punched out of the retired files and, past the capacity, out of this slab; then this slab's capacity grows to
    what the budget allows (its blocks reserved first). Returns the slots the capacity grew by. Raises
    L3StoreError when the reserve fails at open (``punch``); later a failed reserve only leaves the capacity as it
    is (the disk is full: counted by the caller's health)."""
    keep = []
    for r in st.retired:
        if not r.usable or not r.lru.current:
            if r.slab is not None:
                r.slab.close()
            try:
                remove_slab(r.path)
                log.info("L3: removed the %s slab %s (slot size %d B): no page of it is left", st.kind.label, r.path,
                         r.slot_bytes)
            except OSError as e:
                log.warning("L3: could not remove the empty slab %s: %s", r.path, e)
            continue
        if punch:
            live = {slot for _, slot in r.lru.current.values()}
            r.slab.punch(s for s in range(r.num_slots) if s not in live)
        keep.append(r)
    st.retired[:] = keep
    grant = st.grant()
    if punch and st.pool.limit < st.num_slots:
        # Blocks an earlier run left past the capacity, in slots that hold no page now.
        st.slab.punch(s for s in range(max(grant, st.pool.limit), st.num_slots) if not st.pool.is_allocated(s))
    if grant <= st.pool.limit:
        return 0
    try:
        st.slab.reserve(grant)
    except OSError as e:
        if punch:
            raise L3StoreError(f"L3 slab {st.slab.path}: no space to preallocate {grant} slots of {st.slot_bytes} B "
                               f"({e}); lower the disk budget") from e
        raise
    return st.pool.grow_to(grant)


def close_kind(st: "KindState | None", slab=None, retired=()) -> None:
    """Close a kind's slab and its retired slabs (idempotent)."""
    if st is not None:
        slab, retired = st.slab, st.retired
    for s in [slab, *(r.slab for r in retired)]:
        if s is not None:
            try:
                s.close()
            except Exception:  # noqa: BLE001 - closing goes on
                pass

