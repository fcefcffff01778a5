"""A store's ``stats()``: one flat dict of its state and counters, the one source of the Prometheus samples
(hicache/metrics.py names each key it exports; a renamed key is a missing sample) and of the tools' reports."""

from __future__ import annotations

from . import latency


def stats(s) -> dict:
    kinds = list(s.kinds.items())  # one C-level copy: the writer may add a kind meanwhile (add_kind)
    with s.staged.cond:
        qdepth = len(s.staged.queue)
        inflight = s.staged.inflight
    out = {
        "rank": s.rank,
        "disk": s.disk,  # the home disk
        "disks": list(s.disks),
        "cold_start": s.cold_start,
        "cold_start_loaded_pages": s.loaded_pages,  # pages a `load` cold start kept (0 after `clear`)
        "io_mode": {k.label: getattr(grp.home.slab, "io_mode", None) for k, grp in kinds},
        # total: the slots this kind's slabs may use now (its capacity: beside a slab of another page size, what the
        # budget leaves), over the rank's disks; retired: pages still held in its slabs of other page sizes.
        "slots": {k.label: {"used": sum(st.pool.used for st in grp.parts),
                            "total": sum(st.pool.limit for st in grp.parts),
                            "retired": sum(len(r.lru.current) for st in grp.parts for r in tuple(st.retired))}
                  for k, grp in kinds},
        # Per disk of the rank: durable pages, slots, write failures and shed pages (writer.disk_stats), misses from
        # read errors there: a slow or failing drive shows here, and only there.
        "per_disk": per_disk(s),
        "cold_start_other_namespace_pages": s.other_namespace_pages,  # kept by `load`, of other models
        "inflight": inflight,
        "max_inflight": s.config.max_inflight,
        "reload_inflight": s.reloader.inflight,
        "write_queue_depth": qdepth,
        **s.writer.stats(),
        # Acknowledged by spill (write-behind) and not yet durable: what a crash right now would lose. Bounded by
        # the staging cap (queues.staging_bytes / max_inflight); 0 under ack = "durable".
        "acked_not_durable_pages": s.staged.acked_pages,
        "acked_not_durable_bytes": s.staged.acked_bytes,
        "acked_not_durable_oldest_s": s.staged.oldest_acked_age(),
        "staging_bytes": s.staging.in_use,
        "staging_allocated_bytes": s.staging.allocated,
        "staging_peak_bytes": s.staging.peak_allocated,
        "staging_cap_bytes": s.staging.cap,
    }
    out.update(s.c.flat())
    _index_stats(s.index, out)
    out["latency"] = latency.of(s.index).snapshot()  # spill / reload / fdatasync / index-commit histograms
    return out


def _index_stats(index, out: dict) -> None:
    out["index_full"] += index.index_full if index else 0
    out["index_write_errors"] = index.write_errors if index else 0
    out["index_stale_readers_cleared"] = index.stale_readers_cleared if index else 0
    out["index_damage_seen"] = index.damage_seen if index else 0
    # The guard's verdict at this process's first open of the index (engine/index_check.py): "verified", "new",
    # "in_use" (another process of the node opened it first), "salvaged" or "reset" (it was damaged: moved aside
    # to index_moved_to, the new index keeps index_salvage_kept of the index_salvage_claimed entries).
    v = index.verdict if index else None
    out["index_check"] = v.action if v else None
    out["index_repaired"] = int(bool(v and v.repaired))
    out["index_salvage_kept"] = v.kept if v and v.repaired else None
    out["index_salvage_claimed"] = v.claimed if v and v.repaired else None
    out["index_moved_to"] = v.moved_to if v and v.repaired else None


def per_disk(s) -> dict:
    out = s.writer.disk_stats()
    for d, row in out.items():
        row["read_errors"] = s.c.disk_read_errors.get(d, 0)
    return out
