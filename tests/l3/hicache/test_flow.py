"""SGLang's real HiCache stack (UnifiedRadixCache, HybridCacheController, DSA host pool group) with the L3 backend,
one rank, on a CPU: the flows a GLM-5 server runs, asserting loaded token counts and bytes (a failed prefetch
"completes" with 0 tokens, so completion alone proves nothing)."""

import pytest
import torch

from l3kit import write_config

pytestmark = pytest.mark.usefixtures("standins", "sglang_state")  # its stacks publish server args

PS = 64


def _stack(cfg, **spec_kw):
    from sglang_glm_ext.l3.demo import stack

    spec = stack.StackSpec(**spec_kw)
    # SGLang skips a prefetch below its threshold (256 tokens by default); one page is enough here.
    sa = stack.publish_server_args(spec, storage_backend=None, extra_config='{"prefetch_threshold": 64}',
                                   plugin_values={"enable_cp_l3": True, "cp_l3_config": cfg})
    return stack.DsaStack.build(spec, sa)


def _same(a, b):
    return len(a) == len(b) and all(torch.equal(x.view(torch.uint8), y.view(torch.uint8)) for x, y in zip(a, b))


def _tokens(start, pages):
    return list(range(start, start + pages * PS))


def _write(st, tokens, seed):
    slots = st.insert(tokens)
    st.fill_device(slots, seed)
    want = st.snapshot_device(slots)
    st.write_back_storage(tokens)
    return want


def _drop_l2(st, tokens):
    st.evict_device(len(tokens))
    st.evict_host(len(tokens))
    m = st.match(tokens)
    assert m.host_hit_length == 0 and m.device_prefix_len == 0


def _clear_device(st):
    for pool in (st.kv_pool, *st.draft_pools, *st.sidecar_pools):
        for buf in (*pool.kv_buffer, *pool.index_k_with_scale_buffer):
            buf.zero_()


@pytest.mark.parametrize("layout,io,drafts", [("page_first_direct", "direct", 0), ("page_first", "kernel", 0),
                                              ("layer_first", "kernel", 1)])
def test_write_back_evict_prefetch_restores_kv_and_indexer_exactly(tmp_path, layout, io, drafts):
    st = _stack(write_config(tmp_path), layout=layout, io_backend=io, draft_layers=drafts)
    try:
        assert type(st.backend).__name__ == "L3HiCacheStorage"
        assert set(st.backend.plan.pools) == {"kv", "indexer"}
        assert st.backend.namespace.kv_dtype == "float8_e4m3fn"  # from the plugin's storage-config hook
        tokens = _tokens(1, 6)
        want = _write(st, tokens, seed=1)
        stats = st.backend.l3_stats()
        assert stats["store"]["spill_accepted"] == 12  # 6 KV pages (v1) + 6 indexer pages (v2)
        _drop_l2(st, tokens)
        _clear_device(st)
        assert st.prefetch(tokens, "r1") == len(tokens)
        got = st.snapshot_device(st.load_back(tokens))
        assert _same(got, want)
        assert st.backend.l3_stats()["store"]["reload_hits"] == 12
    finally:
        st.close()


def test_restart_with_load_hits_without_recompute(tmp_path):
    cfg = write_config(tmp_path, cold_start="load")
    st = _stack(cfg)
    tokens = _tokens(7, 5)
    want = _write(st, tokens, seed=2)
    st.close()  # shutdown detaches: the store flushes and closes, its locks are released
    st2 = _stack(cfg)
    try:
        assert st2.backend.store.stats()["cold_start_loaded_pages"] == 10
        assert st2.match(tokens).host_hit_length == 0  # a fresh server: nothing on device or host
        assert st2.prefetch(tokens, "after-restart") == len(tokens)
        assert _same(st2.snapshot_device(st2.load_back(tokens)), want)
    finally:
        st2.close()


def test_corrupt_blob_is_a_miss_and_recompute_restores_the_right_bytes(tmp_path):
    import os

    from sglang.srt.mem_cache.utils import get_storage_hash_str

    from sglang_glm_ext.l3.hicache.keys import storage_key

    st = _stack(write_config(tmp_path))
    try:
        tokens = _tokens(3, 4)
        want = _write(st, tokens, seed=3)
        store = st.backend.store
        store.flush()
        hashes = get_storage_hash_str(tokens, None, page_size=PS)
        _, _, slot = store.locate(st.backend.plan.kv.kind, storage_key(hashes[2]))
        slab = store.slab("target_kv")
        with open(slab.path, "r+b") as f:  # a torn / rotten page 2 on disk
            f.seek(slot * slab.slot_bytes + 2048)
            f.write(os.urandom(256))
        _drop_l2(st, tokens)
        assert st.prefetch(tokens, "r-corrupt") == 2 * PS  # exactly the pages before the corrupt one
        assert store.stats()["verify_failures"] == 1
        prefix = st.load_back(tokens)
        assert len(prefix) == 2 * PS
        # Recompute the rest (same tokens -> same KV), as a server would on the miss; its write-back replaces
        # the bad page, and a later prefetch serves all of it.
        slots = st.insert(tokens)
        st.fill_device(slots, seed=3)
        st.write_back_storage(tokens)
        _drop_l2(st, tokens)
        _clear_device(st)
        assert st.prefetch(tokens, "r-again") == len(tokens)
        assert _same(st.snapshot_device(st.load_back(tokens)), want)
    finally:
        st.close()


def test_only_the_durable_prefix_of_a_request_is_loaded(tmp_path):
    """Seed 251-281: L3 holding only a prefix of a request must yield a node of exactly that prefix."""
    import errno

    from sglang_glm_ext.l3.disk.slab import fail_write

    st = _stack(write_config(tmp_path))
    try:
        head = _tokens(11, 3)
        want_head = _write(st, head, seed=4)
        st.backend.store.flush()
        for kind in ("target_kv", "index_k"):  # the disk fails for everything after the head
            st.backend.store.slab(kind).inject_write_fault(fail_write(errno.EIO))
        full = head + _tokens(10_000, 3)
        slots = st.insert(full)
        st.fill_device(slots[len(head):], seed=5)
        st.write_back_storage(full)
        st.backend.store.flush()
        _drop_l2(st, full)
        assert st.prefetch(full, "r-prefix") == len(head)
        m = st.match(full)
        assert m.host_hit_length == len(head)  # the reloaded node holds only the durable pages
        st.cache.sanity_check()
        _clear_device(st)
        assert _same(st.snapshot_device(st.load_back(full)), want_head)
    finally:
        st.close()


def test_two_same_suffix_requests_in_one_tick_do_not_crash_or_leak_host_slots(tmp_path):
    """Seed 163-180: two candidates for the same suffix admitted in one tick."""
    from array import array

    from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle

    st = _stack(write_config(tmp_path))
    try:
        host = st.host_pool("kv")
        free0 = host.available_size()
        tokens = _tokens(21, 4)
        want = _write(st, tokens, seed=6)
        _drop_l2(st, tokens)
        assert host.available_size() == free0
        handles = [CacheRequestHandle(f"twin-{i}", 0) for i in range(2)]
        root = st.cache.root_node_handle()
        for h in handles:  # both issued before the scheduler pumps once: the same tick
            st.cache.prefetch_from_storage(h, root, array("q", tokens), None, None)
        st.pump(lambda: all(st.cache.check_prefetch_progress(h) for h in handles), what="both prefetches")
        loaded = [st.cache.pop_prefetch_loaded_tokens(h) for h in handles]
        assert max(loaded) == len(tokens)  # one of them inserted the node; the other found it there
        st.cache.sanity_check()
        _clear_device(st)
        assert _same(st.snapshot_device(st.load_back(tokens)), want)
        st.evict_device(len(tokens))
        st.evict_host(len(tokens))
        st.pump(lambda: host.available_size() == free0, what="every host slot returned")
    finally:
        st.close()


def test_deployments_differing_only_in_kv_dtype_never_read_each_other(tmp_path):
    cfg = write_config(tmp_path, cold_start="load")
    # kv_cache_dim 576: no FP8 packing, so e4m3 and e5m2 pages are the same uint8 bytes on the host.
    st = _stack(cfg, kv_cache_dim=576, kv_dtype="float8_e4m3fn")
    tokens = _tokens(31, 3)
    _write(st, tokens, seed=7)
    page_bytes = dict(st.backend.store.stats()["slots"])
    st.close()
    st2 = _stack(cfg, kv_cache_dim=576, kv_dtype="float8_e5m2")
    try:
        assert st2.backend.namespace.kv_dtype == "float8_e5m2"
        assert dict(st2.backend.store.stats()["slots"]).keys() == page_bytes.keys()
        assert st2.prefetch(tokens, "other-dtype") == 0
        assert st2.backend.l3_stats()["store"]["reload_hits"] == 0
    finally:
        st2.close()


def test_sidecar_draft_pools_registered_after_attach_round_trip_through_sglang(tmp_path):
    """SGLang registers sidecar DRAFT / DRAFT_INDEXER host pools after the storage attach (what
    maybe_register_hicache_draft does at startup): their kinds join the open store, and SGLang's own write-back
    and prefetch carry their pages with the KV and indexer pages of the same keys."""
    cfg = write_config(tmp_path, cold_start="load", payload_split="weights")
    with open(cfg, "a") as f:
        f.write("[payload_weights]\ntarget_kv = 0.6\nindex_k = 0.15\ndraft_kv = 0.15\ndraft_index_k = 0.1\n")
    st = _stack(cfg, layout="page_first", io_backend="kernel", sidecar_draft=True)
    try:
        be = st.backend
        assert set(be.plan.pools) == {"kv", "indexer", "draft", "draft_indexer"}
        tokens = _tokens(41, 3)
        want = _write(st, tokens, seed=9)
        assert be.l3_stats()["store"]["spill_accepted"] == 12  # 3 pages x (KV, indexer, draft KV, draft indexer)
        _drop_l2(st, tokens)
        _clear_device(st)
        assert st.prefetch(tokens, "sidecar") == len(tokens)
        assert _same(st.snapshot_device(st.load_back(tokens)), want)  # draft bytes included
        assert be.l3_stats()["store"]["reload_hits"] == 12
    finally:
        st.close()
    st2 = _stack(cfg, layout="page_first", io_backend="kernel", sidecar_draft=True)  # restart: load
    try:
        assert st2.backend.store.stats()["cold_start_loaded_pages"] == 12
        assert st2.prefetch(tokens, "sidecar-restart") == len(tokens)
        assert _same(st2.snapshot_device(st2.load_back(tokens)), want)
    finally:
        st2.close()
