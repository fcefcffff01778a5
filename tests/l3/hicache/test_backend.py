"""L3HiCacheStorage on SGLang's real host pools (no controller): every served layout round-trips byte-exact through
v1 (KV) and v2 (indexer, sidecar draft), never writes outside the pages it was given, never raises on the data
path, keeps pages visible between batch_set and durability, and refuses what it cannot serve at attach."""

import os
import time

import pytest
import torch

from sglang_glm_ext.l3.hicache.extra_config import AttachError

from l3kit import write_config

pytestmark = pytest.mark.usefixtures("standins", "published")


def pools(family, layout, **kw):
    from sglang_glm_ext.l3.demo.pools import build_host_pools

    return build_host_pools(family, layout, **kw)


def attach(hp, cfg, **sc):
    from sglang.srt.mem_cache.hicache_storage import PoolName

    from sglang_glm_ext.l3.hicache.backend import L3HiCacheStorage
    from sglang_glm_ext.l3.demo.pools import storage_config

    sc.setdefault("is_mla", hp.family != "mha")
    be = L3HiCacheStorage(storage_config(cfg, **sc), {})
    be.register_mem_pool_host(hp.kv)
    for name, pool in hp.pools.items():
        be.register_mem_host_pool_v2(pool, PoolName(name))
    be.on_host_pools_registered()
    return be


def transfers(hp, keys, idx):
    from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer

    return [PoolTransfer(name=PoolName(n), host_indices=idx, keys=list(keys)) for n in hp.pools if n != "kv"]


def page_block(hp, name, page):
    """Raw bytes of one page of a page-major buffer (for page_unified, where SGLang has no get_data_page)."""
    pool = hp.pools[name]
    buf = pool.kv_buffer.view(-1).view(torch.uint8)
    blk = buf.numel() // pool.page_num
    return bytes(buf[page * blk:(page + 1) * blk].numpy())


def snapshot(hp, pages):
    if hp.layout == "page_unified":
        return {n: [page_block(hp, n, p) for p in pages] for n in hp.pools}
    return {n: [hp.page_bytes(n, p) for p in pages] for n in hp.pools}


LAYOUTS = [
    ("dsa", "layer_first", 0), ("dsa", "page_first", 0), ("dsa", "page_first_direct", 0),
    ("dsa", "page_first", 1), ("dsa", "layer_first", 1),  # GLM-5 NextN draft layer packed into KV + indexer
    ("mla", "page_unified", 0),
    ("mha", "layer_first", 0), ("mha", "page_first", 0), ("mha", "page_first_direct", 0), ("mha", "page_head", 0),
    ("mha", "page_unified", 0),
]


@pytest.mark.parametrize("family,layout,drafts", LAYOUTS, ids=[f"{f}-{lay}-d{d}" for f, lay, d in LAYOUTS])
def test_every_served_layout_round_trips_exactly_and_touches_only_its_pages(tmp_path, family, layout, drafts):
    hp = pools(family, layout, draft_layers=drafts)
    be = attach(hp, write_config(tmp_path))
    try:
        hp.fill_random(11)
        pages = [1, 2, 7]
        keys = [f"page-{p}" for p in pages]
        idx = hp.page_tokens(pages)
        want = snapshot(hp, pages)
        assert be.batch_set_v1(keys, idx) == [True] * 3
        for name, ok in be.batch_set_v2(transfers(hp, keys, idx)).items():
            assert ok == [True] * 3, name
        hp.zero()
        assert be.batch_get_v1(keys, idx) == [True] * 3
        for name, ok in be.batch_get_v2(transfers(hp, keys, idx)).items():
            assert ok == [True] * 3, name
        assert snapshot(hp, pages) == want
        # Nothing outside the three pages was written: every other byte is still zero.
        total = sum(int(b.view(-1).view(torch.uint8).count_nonzero()) for b in hp.buffers())
        written = sum(sum(len(x) - x.count(0) for x in v) for v in want.values())
        assert total == written
        if layout != "page_unified":
            # SGLang's generic flat page has the v1 payload's byte order: both paths read each other's pages.
            t = torch.zeros(hp.kv.get_dummy_flat_data_page().shape, dtype=hp.kv.dtype)
            assert be.get(keys[0], t) is t
            assert bytes(t.view(-1).view(torch.uint8).numpy()) == want["kv"][0]
        assert be.l3_stats()["backend"]["errors"] == 0
    finally:
        be.close()


def test_exists_is_a_prefix_and_v2_folds_the_indexer(tmp_path):
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageExtraInfo, PoolName

    hp = pools("dsa", "page_first")
    be = attach(hp, write_config(tmp_path))
    try:
        hp.fill_random(1)
        keys = ["a", "b", "c", "d"]
        idx = hp.page_tokens([0, 1, 2, 3])
        assert all(be.batch_set_v1(keys[:3], idx[:3 * hp.page_size]))
        # The indexer pages only for the first two keys.
        tr = transfers(hp, keys[:2], idx[:2 * hp.page_size])
        assert be.batch_set_v2(tr)[PoolName.INDEXER] == [True, True]
        be.store.flush()
        assert be.batch_exists(keys, HiCacheStorageExtraInfo()) == 3
        assert be.exists("a") and not be.exists("d")
        res = be.batch_exists_v2(keys, transfers(hp, keys, idx))
        assert res.kv_hit_pages == 2 and res.extra_pool_hit_pages[PoolName.INDEXER] == 2
        assert res.restorable_prefix_pages == [1, 2]
        assert be.batch_exists_v2([], []).kv_hit_pages == 0
    finally:
        be.close()


def test_data_path_never_raises_and_counts_what_it_refused(tmp_path):
    from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer

    hp = pools("dsa", "page_first_direct")
    be = attach(hp, write_config(tmp_path))
    ps = hp.page_size
    bad = torch.arange(1, ps + 1)  # not page-aligned
    assert be.batch_set_v1(["x"], bad) == [False]
    assert be.batch_get_v1(["x"], bad) == [False]
    assert be.batch_set_v1(["x", "y"], torch.arange(ps)) == [False, False]  # too few indices
    past = torch.arange(10_000 * ps, 10_001 * ps)
    assert be.batch_get_v1(["x"], past) == [False]
    assert be.batch_set_v2([PoolTransfer(name=PoolName.SWA, host_indices=torch.arange(ps), keys=["x"])]) == \
        {PoolName.SWA: [False]}
    assert be.batch_get_v2([PoolTransfer(name=PoolName.INDEXER, host_indices=None, keys=["x"])]) == \
        {PoolName.INDEXER: [False]}
    assert be.get("x", torch.zeros(3)) is None and be.set("x", torch.zeros(3)) is False
    assert be.batch_set_v1([], torch.arange(0)) == []
    c = be.l3_stats()["backend"]
    assert c["bad_indices"] >= 7 and c["unknown_pool"] == 1 and c["errors"] == 0
    be.close()
    assert be.batch_set_v1(["x"], torch.arange(ps)) == [False]  # after close: a dropped write, no exception
    assert be.batch_get_v1(["x"], torch.arange(ps)) == [False] and be.batch_exists(["x"]) == 0
    assert be.clear() is False


def test_page_is_visible_to_exists_and_get_as_soon_as_batch_set_returns(tmp_path):
    hp = pools("dsa", "page_first")
    be = attach(hp, write_config(tmp_path))
    try:
        slab = be.store.slab("target_kv")
        gate = {"open": False}
        real = os.pwrite

        def slow_pwrite(fd, data, offset):
            while not gate["open"]:
                time.sleep(0.005)
            return real(fd, data, offset)

        slab.inject_write_fault(slow_pwrite)
        hp.fill_random(5)
        idx = hp.page_tokens([3])
        want = snapshot(hp, [3])["kv"]
        assert be.batch_set_v1(["p3"], idx) == [True]
        key = attach_mod_key("p3")
        assert be.store.exists("target_kv", [key], include_staged=False) == 0  # not durable yet
        assert be.exists("p3") and be.batch_exists(["p3"]) == 1  # ...but visible
        hp.zero()
        assert be.batch_get_v1(["p3"], idx) == [True]  # served from staging, with the disk still stalled
        assert snapshot(hp, [3])["kv"] == want
        assert be.store.stats()["reload_from_staging"] == 1
        gate["open"] = True
        assert be.store.flush(30) and be.store.exists("target_kv", [key], include_staged=False) == 1
        slab.inject_write_fault(None)
    finally:
        gate["open"] = True
        be.close()


def attach_mod_key(k):
    from sglang_glm_ext.l3.hicache.keys import storage_key

    return storage_key(k)


def test_corrupt_blob_is_a_counted_miss(tmp_path):
    hp = pools("dsa", "page_first")
    be = attach(hp, write_config(tmp_path))
    try:
        hp.fill_random(2)
        idx = hp.page_tokens([0, 1])
        assert all(be.batch_set_v1(["a", "b"], idx))
        be.store.flush()
        slab = be.store.slab("target_kv")
        _, _, slot = be.store.locate(be.plan.kv.kind, attach_mod_key("b"))
        with open(slab.path, "r+b") as f:  # flip payload bytes of b's slot behind the store's back
            f.seek(slot * slab.slot_bytes + 4096)
            f.write(b"\xff" * 64)
        os.posix_fadvise(os.open(slab.path, os.O_RDONLY), 0, 0, os.POSIX_FADV_DONTNEED)
        assert be.batch_get_v1(["a", "b"], idx) == [True, False]
        st = be.l3_stats()
        assert st["store"]["verify_failures"] == 1 and st["store"]["reload_misses"] == 1
    finally:
        be.close()


def test_full_disk_is_a_dropped_write_never_an_exception(tmp_path):
    import errno

    from sglang_glm_ext.l3.disk.slab import fail_write

    hp = pools("dsa", "page_first")
    be = attach(hp, write_config(tmp_path))
    try:
        be.store.slab("target_kv").inject_write_fault(fail_write(errno.ENOSPC))
        hp.fill_random(3)
        assert be.batch_set_v1(["a"], hp.page_tokens([0])) == [True]  # accepted into staging...
        be.store.flush()
        assert be.batch_exists(["a"]) == 0  # ...never durable: a miss later, and counted
        assert be.store.stats()["write_errors"] >= 1
        assert be.batch_get_v1(["a"], hp.page_tokens([0])) == [False]
    finally:
        be.close()


def test_get_stats_hands_sglang_storage_metrics_and_drains(tmp_path):
    from sglang.srt.observability.metrics_collector import StorageMetrics

    hp = pools("dsa", "page_first")
    be = attach(hp, write_config(tmp_path))
    try:
        hp.fill_random(4)
        be.batch_set_v1(["a", "b"], hp.page_tokens([0, 1]))
        be.store.flush()
        be.batch_get_v1(["a", "b"], hp.page_tokens([0, 1]))
        m = be.get_stats()
        assert isinstance(m, StorageMetrics) and m.backup_pgs == [2] and m.prefetch_pgs == [2]
        assert len(m.prefetch_bandwidth) == 1 and m.prefetch_bandwidth[0] > 0
        again = be.get_stats()
        assert again.backup_pgs == [] and again.prefetch_pgs == []
    finally:
        be.close()


def test_two_attaches_share_one_store_and_the_last_detach_releases_its_locks(tmp_path):
    from sglang_glm_ext.l3.config import L3Config
    from sglang_glm_ext.l3.engine.store import L3Store

    cfg = write_config(tmp_path)
    hp = pools("dsa", "page_first")
    a = attach(hp, cfg)
    b = attach(hp, cfg)  # a second controller attaching in this process: no SlabLockedError, same store
    assert a.store.shared is b.store.shared and a.store.shared.refs == 2
    hp.fill_random(6)
    assert all(a.batch_set_v1(["k"], hp.page_tokens([2])))
    assert b.exists("k")  # what one attacher wrote the other sees at once
    a.close()
    assert b.store is not None and b.exists("k")
    ns = b.namespace.to_namespace()
    page_bytes = b.plan.page_bytes()
    b.close()
    assert L3Store.find_open(L3Config.load(cfg), 0) is None
    # The slab and index locks are released: the engine opens the same slabs again in this process.
    L3Store.open(L3Config.load(cfg), rank=0, namespace=ns, page_bytes=page_bytes).close()


def test_restart_with_load_serves_pages_written_before(tmp_path):
    cfg = write_config(tmp_path, cold_start="load")
    hp = pools("dsa", "layer_first")
    be = attach(hp, cfg)
    hp.fill_random(8)
    keys, idx = ["r0", "r1"], hp.page_tokens([4, 5])
    want = snapshot(hp, [4, 5])
    assert all(be.batch_set_v1(keys, idx)) and all(be.batch_set_v2(transfers(hp, keys, idx))["indexer"])
    be.close()  # flushes: both pages durable
    hp2 = pools("dsa", "layer_first")
    be2 = attach(hp2, cfg)
    try:
        assert be2.store.stats()["cold_start_loaded_pages"] == 4
        assert be2.batch_get_v1(keys, idx) == [True, True]
        assert be2.batch_get_v2(transfers(hp2, keys, idx))["indexer"] == [True, True]
        assert snapshot(hp2, [4, 5]) == want
    finally:
        be2.close()


def test_kv_dtype_is_part_of_the_namespace(tmp_path):
    cfg = write_config(tmp_path, cold_start="load")
    # MLA without the DSA packing: e4m3 and e5m2 rows are the same 576 uint8 bytes on the host.
    hp = pools("mla", "page_first")
    be = attach(hp, cfg, kv_dtype="float8_e4m3fn")
    hp.fill_random(9)
    assert all(be.batch_set_v1(["same"], hp.page_tokens([1])))
    be.close()
    e5 = pools("mla", "page_first", kv_dtype="float8_e5m2")
    assert e5.kv.kv_buffer.nbytes == hp.kv.kv_buffer.nbytes
    be2 = attach(e5, cfg, kv_dtype="float8_e5m2")
    try:
        assert be2.namespace.kv_dtype == "float8_e5m2"
        assert be2.batch_exists(["same"]) == 0 and be2.batch_get_v1(["same"], e5.page_tokens([1])) == [False]
    finally:
        be2.close()


def weighted_config(tmp_path, name="l3", **overrides):
    """A config whose budget rule sizes every kind alone (what sidecar draft pools need)."""
    path = write_config(tmp_path, name=name, payload_split="weights", **overrides)
    with open(path, "a") as f:
        f.write("[payload_weights]\ntarget_kv = 0.6\nindex_k = 0.15\ndraft_kv = 0.15\ndraft_index_k = 0.1\n")
    return path


def _sidecar(hp):
    draft = pools("dsa", "page_first", layers=1)
    return draft, {"draft": draft.pools["kv"], "draft_indexer": draft.pools["indexer"]}


def _draft_round_trip(be, hp, draft):
    from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer

    hp.fill_random(12)
    draft.fill_random(13)
    idx = hp.page_tokens([0])
    before = [draft.page_bytes(n, 0) for n in ("kv", "indexer")]
    tr = [PoolTransfer(name=PoolName.DRAFT, host_indices=idx, keys=["d"]),
          PoolTransfer(name=PoolName.DRAFT_INDEXER, host_indices=idx, keys=["d"])]
    assert be.batch_set_v1(["d"], idx) == [True]
    assert be.batch_set_v2(tr) == {PoolName.DRAFT: [True], PoolName.DRAFT_INDEXER: [True]}
    draft.zero()
    assert be.batch_get_v2(tr) == {PoolName.DRAFT: [True], PoolName.DRAFT_INDEXER: [True]}
    assert [draft.page_bytes(n, 0) for n in ("kv", "indexer")] == before
    res = be.batch_exists_v2(["d"], tr)
    assert res.kv_hit_pages == 1 and res.extra_pool_hit_pages == {PoolName.KV: 1, PoolName.DRAFT: 1,
                                                                   PoolName.DRAFT_INDEXER: 1}


def test_sidecar_draft_pools_present_at_attach_are_served(tmp_path):
    hp = pools("dsa", "page_first")
    draft, side = _sidecar(hp)
    hp.pools.update(side)
    be = attach(hp, weighted_config(tmp_path))
    try:
        assert set(be.plan.pools) == {"kv", "indexer", "draft", "draft_indexer"}
        # Their formats bind their keys, not the namespace: the same namespace as without them.
        assert {p["pool"] for p in be.namespace.describe()["pools"]} == {"kv", "indexer"}
        _draft_round_trip(be, hp, draft)
        raw = attach_mod_key("d")
        assert be.store.exists("draft_kv", [raw]) == 0  # stored under its format-bound key only
    finally:
        be.close()


def test_sidecar_draft_pools_registered_after_the_store_opened_are_served(tmp_path):
    """SGLang registers sidecar DRAFT / DRAFT_INDEXER pools after the storage attach at startup
    (kv_cache_builder.maybe_register_hicache_draft): their kinds join the open store."""
    from sglang.srt.mem_cache.hicache_storage import PoolName

    cfg = weighted_config(tmp_path, cold_start="load")
    hp = pools("dsa", "page_first")
    draft, side = _sidecar(hp)
    be = attach(hp, cfg)
    try:
        early_ns = be.namespace.sealed_digest()
        be.register_mem_host_pool_v2(side["draft"], PoolName.DRAFT)
        be.register_mem_host_pool_v2(side["draft_indexer"], PoolName.DRAFT_INDEXER)
        assert set(be.store.stats()["slots"]) == {"target_kv", "index_k", "draft_kv", "draft_index_k"}
        _draft_round_trip(be, hp, draft)
        be.register_mem_host_pool_v2(hp.kv, PoolName.KV)  # re-registering the same pool is fine
    finally:
        be.close()
    # A restart that finds the sidecar pools at attach (runtime attach) shares the namespace and the pages.
    hp2 = pools("dsa", "page_first")
    draft2, side2 = _sidecar(hp2)
    hp2.pools.update(side2)
    be2 = attach(hp2, cfg)
    try:
        assert be2.namespace.sealed_digest() == early_ns
        from sglang.srt.mem_cache.hicache_storage import PoolTransfer

        tr = [PoolTransfer(name=PoolName.DRAFT, host_indices=hp2.page_tokens([0]), keys=["d"])]
        assert be2.batch_get_v2(tr) == {PoolName.DRAFT: [True]}
        assert draft2.page_bytes("kv", 0) == draft.page_bytes("kv", 0)
    finally:
        be2.close()


def test_a_late_pool_is_refused_loudly_where_it_cannot_be_served(tmp_path):
    from sglang.srt.mem_cache.hicache_storage import PoolName

    hp = pools("dsa", "page_first")
    be = attach(hp, write_config(tmp_path))  # equal_slots: no kind can be sized on its own
    try:
        late = pools("dsa", "page_first", layers=1).pools["kv"]
        with pytest.raises(AttachError, match="registered after the store opened.*payload_weights"):
            be.register_mem_host_pool_v2(late, PoolName.DRAFT)
        with pytest.raises(AttachError, match="only the sidecar draft pools"):
            be.register_mem_host_pool_v2(late, PoolName.SWA)
        assert "draft_kv" not in be.store.stats()["slots"]
        be.register_mem_host_pool_v2(hp.kv, PoolName.KV)  # re-registering the same pool is fine
    finally:
        be.close()
    hp = pools("dsa", "page_first")
    _, side = _sidecar(hp)
    hp.pools.update(side)
    assert "payload_weights" in _attach_error(hp, write_config(tmp_path, name="eq2"))


def _attach_error(hp, cfg, **kw):
    with pytest.raises(AttachError) as exc:
        attach(hp, cfg, **kw)
    return str(exc.value)


def test_unservable_pools_and_modes_are_refused_at_attach(tmp_path, monkeypatch):
    from sglang_glm_ext.l3.hicache import sglang_pools

    cfg = write_config(tmp_path)
    hp = pools("dsa", "page_first")
    assert "KV dtype is unknown" in _attach_error(pools("mha", "page_first"), cfg, kv_dtype=None)
    hp.pools["swa"] = hp.pools["indexer"]
    assert "'swa'" in _attach_error(hp, cfg)
    hp.pools.pop("swa")

    class MambaPoolHost:  # any class the backend does not know
        layout = "page_first"

    hp.pools["indexer"] = MambaPoolHost()
    assert "not served by L3" in _attach_error(hp, cfg)
    monkeypatch.setattr(sglang_pools, "host_memory_mode", lambda: "buffer_only")
    assert "buffer_only" in _attach_error(pools("dsa", "page_first"), cfg)
    monkeypatch.undo()
    from sglang.srt.runtime_context import get_parallel

    with get_parallel().override(tp_rank=1, tp_size=2, attn_tp_size=2, moe_tp_size=2):  # rank 1 of TP 2 vs a 1-rank config
        assert "ranks.count = 1" in _attach_error(pools("dsa", "page_first"), cfg)
    from sglang_glm_ext.l3.config import L3Config
    from sglang_glm_ext.l3.engine.store import L3Store

    assert L3Store.find_open(L3Config.load(cfg), 0) is None  # a refused attach leaves no store open


def test_backend_refuses_to_be_built_by_hand_without_the_plugin_config():
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

    from sglang_glm_ext.l3.hicache.backend import L3HiCacheStorage

    sc = HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                              is_mla_model=True, enable_storage_metrics=False, is_page_first_layout=True,
                              model_name="m", extra_config={"backend_name": "x"})
    with pytest.raises(AttachError, match="--enable-cp-l3"):
        L3HiCacheStorage(sc, {})


def test_a_failing_engine_is_a_miss_or_a_dropped_write_never_an_exception(tmp_path, monkeypatch):
    from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer

    hp = pools("dsa", "page_first")
    be = attach(hp, write_config(tmp_path))
    try:
        hp.fill_random(14)
        idx = hp.page_tokens([0])

        def boom(*args, **kwargs):
            raise RuntimeError("engine bug")

        for name in ("spill_from_layout", "reload_into_layout", "exists", "spill", "reload_into", "clear"):
            monkeypatch.setattr(be.store.shared, name, boom)
        tr = [PoolTransfer(name=PoolName.INDEXER, host_indices=idx, keys=["e"])]
        assert be.batch_set_v1(["e"], idx) == [False] and be.batch_get_v1(["e"], idx) == [False]
        assert be.batch_set_v2(tr) == {PoolName.INDEXER: [False]} and be.batch_get_v2(tr) == {PoolName.INDEXER: [False]}
        assert be.batch_exists(["e"]) == 0 and be.batch_exists_v2(["e"], tr).kv_hit_pages == 0
        assert be.set("e", torch.zeros(hp.kv.get_dummy_flat_data_page().shape, dtype=hp.kv.dtype)) is False
        assert be.get("e", torch.zeros(hp.kv.get_dummy_flat_data_page().shape, dtype=hp.kv.dtype)) is None
        assert be.clear() is False
        assert be.batch_get_v2(None) == {} and be.batch_set_v2([object()]) == {None: []}  # malformed transfers
        assert be.l3_stats()["backend"]["errors"] >= 9
    finally:
        monkeypatch.undo()
        be.close()


def test_get_stats_is_constant_work_whatever_the_traffic(tmp_path, monkeypatch):
    from sglang_glm_ext.l3.hicache import datapath

    monkeypatch.setattr(datapath, "_SAMPLES", 3)
    hp = pools("dsa", "page_first")
    be = attach(hp, write_config(tmp_path))
    try:
        hp.fill_random(15)
        for p in range(6):
            assert be.batch_set_v1([f"s{p}"], hp.page_tokens([p % 4])) == [True]
        # get_stats never asks the store anything: it only swaps its sample lists.
        for name in ("stats", "exists", "flush"):
            monkeypatch.setattr(be.store.shared, name, lambda *a, **k: (_ for _ in ()).throw(AssertionError(name)))
        m = be.get_stats()
        assert m.backup_pgs == [1, 1, 1] and len(m.backup_bandwidth) == 3  # bounded per interval, not per call
        assert be.get_stats().backup_pgs == []
    finally:
        monkeypatch.undo()
        be.close()


def test_the_namespace_the_backend_names_is_the_digest_every_blob_is_sealed_with(tmp_path):
    from sglang_glm_ext.l3.disk.format import parse_header

    hp = pools("dsa", "page_first")
    be = attach(hp, write_config(tmp_path))
    try:
        hp.fill_random(16)
        assert be.batch_set_v1(["n"], hp.page_tokens([1])) == [True] and be.store.flush(30)
        _, _, slot = be.store.locate("target_kv", attach_mod_key("n"))
        raw = be.store.slab("target_kv").read_header(slot)
        hdr = raw if hasattr(raw, "ns_digest") else parse_header(raw)
        sealed = be.namespace.sealed_digest()
        assert hdr.ns_digest == sealed == be.store.ns  # namespace fields + the deployment, each counted once
        assert be.namespace.describe()["digest"] == sealed.hex()
        assert be.config.deployment_id not in be.namespace.to_namespace().canonical().decode()
    finally:
        be.close()


@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
def test_glm5_host_pools_are_read_straight_into_their_pages_with_no_payload_copy(tmp_path, layout):
    """Issue 13 through the backend: SGLang's own GLM-5-shaped DSA host pools (656 B rows, 64-token pages: 41,984 B
    per layer chunk, 512 B-aligned), once durable, are reloaded by O_DIRECT reads straight into each layer's chunk
    (layer_first) or the page (page_first). Where the slab's file system reports 512 B memory alignment or finer and
    SGLang's host buffer is mem-aligned (its host allocator mmaps), not one KV payload byte goes through the bounce
    buffer."""
    hp = pools("dsa", layout)
    be = attach(hp, write_config(tmp_path))
    try:
        hp.fill_random(13)
        pages = [0, 3, 5]
        keys = [f"d{p}" for p in pages]
        idx = hp.page_tokens(pages)
        want = snapshot(hp, pages)
        assert all(be.batch_set_v1(keys, idx)) and all(be.batch_set_v2(transfers(hp, keys, idx))["indexer"])
        assert be.store.flush(30)  # durable: served from the slab, not from staging
        hp.zero()
        before = dict(be.store.diagnostics().io_counters())
        assert be.batch_get_v1(keys, idx) == [True] * 3
        io = {k: v - before.get(k, 0) for k, v in be.store.diagnostics().io_counters().items()}
        kv_page = be.plan.kv.page_bytes
        assert io["span_reads"] == 3 and io["direct_bytes"] + io["bounced_bytes"] == 3 * kv_page
        align = {a for name, a in be.store.diagnostics().alignment().items() if "target_kv" in name}
        base = hp.kv.kv_buffer.data_ptr()
        if align and all("mem 512 B" in a or "mem 4 B" in a for a in align) and base % 512 == 0:
            assert io["direct_bytes"] == 3 * kv_page and io["bounced_bytes"] == 0, (align, io)
        assert be.batch_get_v2(transfers(hp, keys, idx))["indexer"] == [True] * 3
        assert snapshot(hp, pages) == want
        assert be.store.stats()["reload_from_staging"] == 0
    finally:
        be.close()
