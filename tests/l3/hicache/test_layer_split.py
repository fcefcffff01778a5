"""DSA cache layer split (``--enable-dsa-cache-layer-split``) in one process, on SGLang's real pools: each CP rank's
host pool holds its own layers of every page (``LayerSplitDSATokenToKVPool`` + the host pool SGLang's
``build_kv_host_pool`` makes of it). Each rank spills and reloads its own part under a namespace naming the part,
writes it itself, and never reads another part -- even one of the same byte size. The multi-process flows through
SGLang's controllers and MINs are in ``test_cp_layer_split.py``."""

import hashlib

import pytest
import torch

from sglang_glm_ext.l3.hicache.extra_config import AttachError

import leakguard
from l3kit import write_config
from .test_backend import transfers

PS = 64
LAYERS = 5  # split over 2 ranks: 3 + 2 layers; over 3: 2 + 2 + 1 (ranks 0 and 1: equal page bytes, other layers)

pytestmark = pytest.mark.usefixtures("standins")


@pytest.fixture(autouse=True)
def published(standins):
    from sglang_glm_ext.l3.demo import stack

    with leakguard.kept():  # what was published before this test, back when it ends (its ranks publish their own)
        stack.publish_server_args(stack.StackSpec(), storage_backend=None, extra_config=None)
        yield


def _config(tmp_path, ranks, **kw):
    p = write_config(tmp_path, **kw)
    text = open(p).read().replace("count = 1", f"count = {ranks}")
    open(p, "w").write(text)
    return p


def _keys(n, salt="k"):
    return [hashlib.sha256(f"{salt}{i}".encode()).hexdigest() for i in range(n)]


def _rank(cfg, rank, size, layout, *, patch=True, sync=None, sc_cp=None, layers=LAYERS, group_ranks=None):
    """CP rank ``rank`` of ``size`` under layer split: publish its topology, build its pools through SGLang, attach
    its backend with the storage config SGLang's controller (plus the plugin's hooks) would hand it."""
    from sglang.srt.mem_cache.hicache_storage import PoolName
    from sglang.srt.runtime_context import get_parallel

    from sglang_glm_ext.l3.demo import stack
    from sglang_glm_ext.l3.demo.pools import build_host_pools, storage_config
    from sglang_glm_ext.l3.hicache.backend import L3HiCacheStorage

    stack.publish_server_args(stack.StackSpec(layout=layout), storage_backend=None, extra_config=None)
    with get_parallel().override(**stack.layer_split_parallel(rank, size, ranks=group_ranks)):
        hp = build_host_pools("dsa", layout, layers=layers, layer_split=(rank, size))
        cp_rank, cp_size = sc_cp or (rank, size)
        extra = {} if sync is False else {"sync_group_ranks": [list(range(size))] if sync is None else sync}
        be = L3HiCacheStorage(storage_config(cfg, tp_rank=rank, tp_size=size, attn_cp_rank=cp_rank,
                                             attn_cp_size=cp_size, writers_patch=patch, user_extra=extra), {})
        be.register_mem_pool_host(hp.kv)
        for name, pool in hp.pools.items():
            be.register_mem_host_pool_v2(pool, PoolName(name))
        be.on_host_pools_registered()
    return hp, be


def _own_bytes(hp, name, pages):
    """The bytes of this rank's own layers of ``pages`` (the host page minus the padding layer a rank owning fewer
    than ceil(L/N) layers keeps unwritten): what SGLang reads back into the device."""
    pool = hp.pools[name]
    if name == "kv":
        n_own = len(pool._target_layer_indices)
        if pool.layout == "layer_first":
            return [bytes(pool.kv_buffer[:n_own, p * PS:(p + 1) * PS].contiguous().view(torch.uint8).numpy())
                    for p in pages]
        return [bytes(pool.kv_buffer[p * PS:(p + 1) * PS, :n_own].contiguous().view(torch.uint8).numpy())
                for p in pages]
    return [hp.page_bytes(name, p) for p in pages]


def _write(be, hp, keys, idx):
    assert be.batch_set_v2(transfers(hp, keys, idx))["indexer"] == [True] * len(keys)
    assert be.batch_set_v1(keys, idx) == [True] * len(keys)
    assert be.store.flush(30)


@pytest.mark.parametrize("size,layout", [(2, "layer_first"), (3, "layer_first"), (3, "page_first")])
def test_each_rank_writes_and_reloads_its_own_layers_under_its_own_namespace(tmp_path, size, layout):
    from sglang.srt.layers.cp.utils import get_layer_shard_range

    cfg = _config(tmp_path, size)
    ranks = [_rank(cfg, r, size, layout) for r in range(size)]
    try:
        keys, n = _keys(6), 6
        idx = torch.arange(0, n * PS, dtype=torch.int64)
        want = []
        for r, (hp, be) in enumerate(ranks):
            start, end = get_layer_shard_range(r, size, LAYERS)
            ns = be.namespace
            assert (ns.layer_start, ns.layer_end) == (start, end)
            assert ns.shard.tag() == f"replicated-pp0of1-lsplit{r}of{size}"
            assert be.writers.writes_everything  # attention TP 1: the only holder of its part writes it
            hp.fill_random(100 + r)  # each rank's part holds its own bytes
            want.append({name: _own_bytes(hp, name, range(n)) for name in hp.pools})
            _write(be, hp, keys, idx)
        assert len({be.namespace.sealed_digest() for _, be in ranks}) == size  # parts never share a digest
        for r, (hp, be) in enumerate(ranks):
            st = be.store.stats()
            assert st["spill_accepted"] == 2 * n and be.l3_stats()["backend"]["set_not_owned"] == 0
            assert be.batch_exists(keys) == n
            hp.zero()
            assert be.batch_get_v1(keys, idx) == [True] * n
            assert be.batch_get_v2(transfers(hp, keys, idx))["indexer"] == [True] * n
            assert {name: _own_bytes(hp, name, range(n)) for name in hp.pools} == want[r], f"rank {r}"
    finally:
        for _, be in ranks:
            be.close()


def test_a_part_of_the_same_byte_size_is_never_read_as_this_ranks_layers(tmp_path):
    """Over 3 ranks, ranks 0 and 1 both hold 2 KV layers and 2 indexer layers per page (equal page bytes, other
    layers). What rank 0 wrote must be a miss for rank 1, never its layers: without the part in the namespace the
    two would share a digest and rank 1 would load rank 0's layers as its own."""
    cfg = _config(tmp_path, 3)
    (hp0, be0), (hp1, be1) = _rank(cfg, 0, 3, "layer_first"), _rank(cfg, 1, 3, "layer_first")
    try:
        assert be0.plan.page_bytes() == be1.plan.page_bytes()
        keys = _keys(4, "same-size")
        idx = torch.arange(0, 4 * PS, dtype=torch.int64)
        hp0.fill_random(5)
        _write(be0, hp0, keys, idx)
        assert be0.batch_exists(keys) == 4
        hp1.fill_random(6)
        before = {name: _own_bytes(hp1, name, range(4)) for name in hp1.pools}
        assert be1.batch_exists(keys) == 0
        res = be1.batch_exists_v2(keys, transfers(hp1, keys, idx))
        assert res.kv_hit_pages == 0
        assert be1.batch_get_v1(keys, idx) == [False] * 4
        assert be1.batch_get_v2(transfers(hp1, keys, idx))["indexer"] == [False] * 4
        assert {name: _own_bytes(hp1, name, range(4)) for name in hp1.pools} == before  # nothing landed
    finally:
        be0.close()
        be1.close()


def test_another_split_or_layer_count_is_another_namespace(tmp_path):
    """Restarting with a different split (N) on the same disks is a clean miss: no page of the old split is found,
    none read."""
    cfg = _config(tmp_path, 3, cold_start="load")
    hp, be = _rank(cfg, 0, 2, "layer_first")
    keys = _keys(3, "split")
    idx = torch.arange(0, 3 * PS, dtype=torch.int64)
    try:
        hp.fill_random(9)
        _write(be, hp, keys, idx)
        old = be.namespace.sealed_digest()
    finally:
        be.close()
    hp, be = _rank(cfg, 0, 3, "layer_first")
    try:
        assert be.namespace.sealed_digest() != old
        assert be.store.stats()["cold_start_other_namespace_pages"] > 0  # the old split's pages are kept, not ours
        assert be.batch_exists(keys) == 0
        assert be.batch_get_v1(keys, idx) == [False] * 3
        assert be.store.stats()["reload_hits"] == 0
    finally:
        be.close()
    hp, be = _rank(cfg, 0, 2, "layer_first")  # the old split again: its pages are still there (load)
    try:
        assert be.namespace.sealed_digest() == old and be.batch_exists(keys) == 3
    finally:
        be.close()


def test_layer_split_without_the_writer_patch_is_refused(tmp_path):
    with pytest.raises(AttachError, match="l3.cp_storage_writers patch is not in place"):
        _rank(_config(tmp_path, 2), 1, 2, "layer_first", patch=False)


def test_a_part_group_outside_sglangs_min_groups_is_refused(tmp_path):
    cfg = _config(tmp_path, 2)
    with pytest.raises(AttachError, match="not all in one of the HiCache controller's storage MIN groups"):
        _rank(cfg, 0, 2, "layer_first", sync=[[0], [1]])  # no group holds both parts of a page
    with pytest.raises(AttachError, match="not all in one of"):
        _rank(cfg, 0, 2, "layer_first", sync=[])  # no MIN at all
    with pytest.raises(AttachError, match="storage MIN groups are unknown"):
        _rank(cfg, 0, 2, "layer_first", sync=False)  # the l3.storage_kv_dtype hook did not run
    hp, be = _rank(cfg, 0, 2, "layer_first", sync=[[0, 1, 2, 3]])  # a wider group (CP x attention TP) covers it
    be.close()


def test_the_parts_sources_must_agree(tmp_path):
    cfg = _config(tmp_path, 2)
    # the controller's attention-CP group (storage config) says rank 1, the pool was split for rank 0
    with pytest.raises(AttachError, match="differs between"):
        _rank(cfg, 0, 2, "layer_first", sc_cp=(1, 2))
    # the layer-shard group is other ranks than the controller's MIN group (SGLang's groups changed under us)
    with pytest.raises(AttachError, match=r"\[4, 5\] are not all in one of"):
        _rank(cfg, 0, 2, "layer_first", group_ranks=(4, 5))


def test_plain_cp_namespaces_keep_their_digests():
    """Byte-identical plain attention CP: the new shard fields add nothing to an existing tag, so a page written
    before this change is still found (digest pinned from the code before layer split was served)."""
    from sglang_glm_ext.l3.hicache.keys import NamespaceSpec, PoolFormat, ShardIdentity

    shard = ShardIdentity(replicated=True)
    assert shard.tag() == "replicated-pp0of1"
    assert ShardIdentity(replicated=False, tp_rank=1, tp_size=2, dcp_rank=1, dcp_size=2).tag() == \
        "tp1of2-pp0of1-dcp1of2"
    ns = NamespaceSpec("dep", "glm", "float8_e4m3fn", "page_first", 64, 0, 78,
                       (PoolFormat("kv", "mla", "page_first", 3274752, 78, 0, "row=656"),), shard)
    assert ns.sealed_digest().hex() == PINNED_PLAIN_DIGEST
    assert ShardIdentity(replicated=True, layer_shard_rank=0, layer_shard_size=2).tag() == \
        "replicated-pp0of1-lsplit0of2"
    assert ShardIdentity(replicated=True, kv_shard_size=4).tag() == "replicated-pp0of1-kvshard4"


PINNED_PLAIN_DIGEST = "d7717452f1d63b7611df55fabc7cc90a"  # computed at e3c98ce


def test_writers_are_chosen_only_among_the_ranks_holding_the_same_part():
    from sglang_glm_ext.l3.hicache.cp_writers import Topology, WriterPlan

    # 8 ranks: attention CP 4 x attention TP 2; rank 5 is CP rank 2, its part's replicas are its attention-TP pair
    t = Topology(tp_rank=5, tp_size=8, attn_cp_size=4, cp_parts=True)
    assert t.attn_cp_rank == 2 and t.replicas() == (4, 5)
    assert Topology(tp_rank=5, tp_size=8, attn_cp_size=4).replicas() == tuple(range(8))  # plain CP unchanged
    plans = [WriterPlan.build(Topology(tp_rank=r, tp_size=8, attn_cp_size=4, cp_parts=True), "spread")
             for r in range(8)]
    keys = [hashlib.sha256(bytes([i])).digest() for i in range(64)]
    for cp in range(4):
        pair = plans[2 * cp: 2 * cp + 2]
        assert all(p.writers == (2 * cp, 2 * cp + 1) for p in pair)
        owned = [p.owned(keys) for p in pair]
        assert all(a != b for a, b in zip(*owned))  # each page of this part: exactly one of the pair writes it
    # attention TP 1 (GLM-5's usual layer split): every rank writes its whole part
    assert all(WriterPlan.build(Topology(tp_rank=r, tp_size=4, attn_cp_size=4, cp_parts=True), "spread")
               .writes_everything for r in range(4))


def test_sglang_still_builds_its_storage_min_groups_the_way_sync_group_ranks_reads_them():
    """hooks.sync_group_ranks re-derives the rank sets of HiCacheController._create_sync_groups (the groups every
    storage MIN reduces over) from the controller's groups; the gloo test compares it with the real groups. Pin the
    source lines it mirrors, so a change in SGLang fails here on a CPU, not silently under layer split."""
    import inspect

    from sglang.srt.managers.cache_controller import HiCacheController

    src = inspect.getsource(HiCacheController._create_sync_groups)
    for line in ("if self.attn_cp_group is not None or self.attn_tp_group is not None:",
                 "base_groups = [self.attn_cp_group, self.attn_tp_group]", "base_groups = [self.tp_group]",
                 "base_groups.append(self.pp_group)",
                 "if group is None or torch.distributed.get_world_size(group=group) == 1:",
                 "if group_ranks in seen_rank_sets:"):
        assert line in src, line
    attach = inspect.getsource(HiCacheController.attach_storage_backend)
    assert "self.prefetch_hits_sync_groups = self._create_sync_groups()" in attach
    assert "self.prefetch_completion_sync_groups = self._create_sync_groups()" in attach
