"""What every gloo rank of the CP demos does alike (``cp_ranks.py``: plain attention CP; ``cp_layer_split.py``:
DSA cache layer split; ``dedup_ranks.py``: host dedup): the tokens of a scenario, their page keys, a flush of every
rank's store, how many pages are durable, dropping pages from L1/L2 so the next prefetch must reach L3, a rank's page
counts, a page rotting on disk, and a child's result written before it exits. DEMO/TEST-ONLY."""

from __future__ import annotations

PS = 64


def tokens(start: int, pages: int) -> list[int]:
    return list(range(start, start + pages * PS))


def drop_l2(st, tokens):
    everything = 8 * st.spec.device_pages * PS
    st.evict_device(everything)
    st.evict_host(everything)
    m = st.match(tokens)
    assert m.host_hit_length == 0 and m.device_prefix_len == 0, "L1/L2 still hold the tokens"
    for pool in (st.kv_pool, *st.draft_pools):
        for buf in (*pool.kv_buffer, *pool.index_k_with_scale_buffer):
            buf.zero_()


def durable(st, keys) -> int:
    from ..hicache.keys import storage_keys

    be = st.backend
    return be.store.exists(be.plan.kv.kind, storage_keys(keys), include_staged=False)


def page_keys(tokens):
    from sglang.srt.mem_cache.utils import get_storage_hash_str

    return get_storage_hash_str(tokens, None, page_size=PS)


def flush_all(st, group):
    """Every store this rank writes durable (a host-dedup source: every writer's; a peer has none), then a barrier."""
    import torch.distributed as dist

    assert all(store.flush(60) for store in st.backend.stores), "store flush timed out"
    dist.barrier(group=group)


def rot_page(be, keys, i: int) -> bool:
    """Page ``i`` of ``keys`` rots on disk (256 random bytes inside its payload) where this process wrote it (its own
    store, or under host dedup the source's store of another rank), and the page cache is dropped so the next read
    meets the disk's bytes. False (nothing done) where another process holds the store the page is in."""
    import os

    from ..hicache.keys import storage_key

    stores = {st.rank: st for st in be.stores}
    if not stores:
        return False
    rank, disk, slot = next(iter(stores.values())).locate(be.plan.kv.kind, storage_key(keys[i]))
    if rank not in stores:
        return False
    slab = stores[rank].slab("target_kv", disk=disk)
    with open(slab.path, "r+b") as f:
        f.seek(slot * slab.slot_bytes + 2048)
        f.write(os.urandom(256))
    fd = os.open(slab.path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    return True


def write_result(path: str, out: dict, status: int):
    """A rank child's last step: its result on disk atomically, then exit without interpreter teardown (SGLang's
    atexit hooks, gloo) once it is there."""
    import json
    import os
    import sys

    with open(path + ".tmp", "w") as f:
        json.dump(out, f)
    os.replace(path + ".tmp", path)
    sys.stdout.flush()
    os._exit(status)


def counts(st) -> dict:
    """This rank's page counts: the store's (pages accepted / dropped by spill, reload hits and misses) and the
    backend's own (pages another replica owns, acknowledged without a write)."""
    s = st.backend.store.stats()
    return {"spill_accepted": s["spill_accepted"], "not_owned": st.backend.l3_stats()["backend"]["set_not_owned"],
            "dropped": s["dropped_staging"] + s["dropped_pool_full"] + s["dropped_bad_input"],
            "reload_hits": s["reload_hits"], "reload_misses": s["reload_misses"]}
