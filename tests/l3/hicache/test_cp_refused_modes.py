"""The two modes in which CP ranks hold different bytes that L3 still refuses, each with the reason proven on a CPU
from SGLang 0.5.23's own code (docs_internal/l3_cp.md, "Ranks that hold different bytes").

KV sharding (``--enable-kv-cache-sharding``): what can be built and proven here is built and proven -- the namespace
(``kvshard N``, no rank), and which rank holds which storage page, by ``parts.kv_stripe`` checked against SGLang's own
``PageInterleavePlacement``, ``PageInterleavePoolAllocator`` (rotated chains) and ``PageInterleaveHostPool`` over a real
MLA host pool. What blocks serving is shown too: SGLang's prefetch cannot allocate host slots on that pool at all
(the pool asserts without a rotation owner; the controller passes none) and inserts prefetched nodes without a
rotation base. The attach refuses the pool, naming that.

DCP (``--dcp-size > 1``): SGLang itself refuses L3 under DCP for GLM-5's DSA pools with every backend and refuses
HiCache under DCP for MHA (GLM-4.x) at launch; the lines are pinned so a SGLang that lifts them fails here.
"""

import inspect

import numpy as np
import pytest
import torch

from sglang_glm_ext.l3.hicache.extra_config import AttachError
from sglang_glm_ext.l3.hicache.parts import DCP_REFUSED, KV_SHARDING_REFUSED, kv_stripe

from l3kit import write_config
from .test_backend import attach

PS = 64

pytestmark = pytest.mark.usefixtures("standins", "published")


def _placement(rank, n):
    from sglang.srt.mem_cache.page_interleave import PageInterleavePlacement, PageShardSpec

    return PageInterleavePlacement(PageShardSpec(rank, n, PS, 4 * PS, PS))


def _sharded_host_pool(rank, n):
    from sglang.srt.mem_cache.pool_host.page_interleave import PageInterleaveHostPool

    from sglang_glm_ext.l3.demo.pools import build_host_pools

    hp = build_host_pools("mla", "layer_first", device_pages=8)
    return hp, PageInterleaveHostPool(hp.kv, _placement(rank, n))


# ---------------------------------------------------------------------------------------- KV sharding
@pytest.mark.parametrize("n", [2, 3, 4])
def test_kv_stripe_is_sglangs_placement_on_the_host_slots_sglang_allocates(n):
    """For chains SGLang's host pool allocates at every rotation (alloc(start_owner), as its D2H backup does), each
    rank's pages and local pages by kv_stripe are exactly the rows SGLang's owned_rows narrows a transfer to."""
    rng = np.random.default_rng(n)
    pools = [_sharded_host_pool(r, n)[1] for r in range(n)]  # SPMD: every rank allocates the same logical slots
    for _ in range(6):
        pages = int(rng.integers(1, 9))
        start = int(rng.integers(0, n))
        logical = [p.alloc(pages * PS, start_owner=start) for p in pools]
        assert all(torch.equal(logical[0], x) for x in logical[1:])
        host = logical[0]
        holders = []
        for r, pool in enumerate(pools):
            got = kv_stripe(host.numpy(), pages, page_size=PS, shard_size=n, shard_rank=r,
                            local_pages=pool.size // PS)
            assert got is not None
            mine, local = got
            rows, _ = pool.owned_rows(host, host)  # SGLang: this rank's local host rows of the transfer
            ours = torch.cat([torch.arange(lp * PS, (lp + 1) * PS) for lp, m in zip(local, mine) if m]) \
                if any(mine) else torch.empty(0, dtype=torch.int64)
            assert torch.equal(rows.to(torch.int64), ours), (r, start)
            holders.append(mine)
        # every page has exactly one holder, and the holders cycle from the chain's start owner
        assert [sum(h[i] for h in holders) for i in range(pages)] == [1] * pages
        assert [next(r for r in range(n) if holders[r][i]) for i in range(pages)] == \
            [(start + i) % n for i in range(pages)]
        for p in pools:
            p.free(host)


def test_kv_stripe_follows_the_allocators_rotations_across_requests():
    """Several requests of one batch with their own rotation bases (PageInterleavePoolAllocator.alloc_extend): the
    placement SGLang derives everywhere from the slot (owner_of, local_index) is kv_stripe's, page by page."""
    from sglang.srt.mem_cache.allocator.page_interleave import PageInterleavePoolAllocator

    n = 4
    alloc = PageInterleavePoolAllocator(size=64 * PS, physical_page_size=PS, shard_size=n, dtype=torch.int64,
                                        device="cpu", kvcache=None, need_sort=False)
    alloc.debug_mode = True
    lens = torch.tensor([5 * PS, 3 * PS, 7 * PS], dtype=torch.int64)
    zero = torch.zeros(3, dtype=torch.int64)
    out = alloc.alloc_extend(prefix_lens=zero, prefix_lens_cpu=zero, seq_lens=lens, seq_lens_cpu=lens,
                             last_loc=zero - 1, extend_num_tokens=int(lens.sum()), rotation_bases=[2, 0, 3])
    assert out is not None
    for r in range(n):
        pl = _placement(r, n)
        mine, local = kv_stripe(out.numpy(), len(out) // PS, page_size=PS, shard_size=n, shard_rank=r,
                                local_pages=64)
        starts = out[::PS]
        assert mine == pl.local_mask(starts, r).tolist()
        assert [lp * PS for lp in local] == pl.local_index(starts).tolist()
    assert kv_stripe(out.numpy()[1:], len(out) // PS - 1, page_size=PS, shard_size=n, shard_rank=0,
                     local_pages=64) is None  # not whole pages: refused, never guessed


def test_kv_sharding_prefetch_cannot_allocate_host_slots_in_sglang_0_5_23():
    """Why it stays refused (the first of SGLang's gaps, run on a CPU): the controller's prefetch allocates host
    slots with mem_pool_host.alloc(need_size), no start owner, and the KV-sharded host pool asserts on that."""
    from sglang.srt.managers.cache_controller import HiCacheController
    from sglang.srt.mem_cache.unified_cache.unified_tree_core import UnifiedTreeCore

    _, pool = _sharded_host_pool(0, 2)
    with pytest.raises(AssertionError, match="start_owner|owner"):
        pool.alloc(2 * PS)
    assert "return self.mem_pool_host.alloc(need_size)" in inspect.getsource(
        HiCacheController.alloc_prefetch_host_buffers)
    # ... and the host node a prefetch inserts carries no rotation base (an extension would then draw a new one)
    assert "rotation" not in inspect.getsource(UnifiedTreeCore.insert_host)


def test_the_backend_refuses_a_kv_sharded_host_pool_naming_why(tmp_path):
    from sglang_glm_ext.l3.demo.pools import build_host_pools

    hp = build_host_pools("mla", "layer_first", device_pages=8)
    from sglang.srt.mem_cache.pool_host.page_interleave import PageInterleaveHostPool

    hp.pools["kv"] = PageInterleaveHostPool(hp.kv, _placement(0, 2))
    with pytest.raises(AttachError, match="KV-sharded .*rotation owner"):
        attach(hp, write_config(tmp_path))


def test_sglang_still_refuses_storage_under_kv_sharding():
    """SGLang's own refusals of a storage backend with KV sharding (launch, runtime attach) stand beside the plugin's:
    lifting the plugin's would not serve the mode."""
    from sglang.srt.arg_groups import kv_shard_hook
    from sglang.srt.mem_cache.unified_cache import storage_attachment

    assert "supports HiCache host offload but not" in inspect.getsource(kv_shard_hook)
    assert "--enable-kv-cache-sharding does not support a HiCache storage" in inspect.getsource(storage_attachment)


def test_kv_shard_namespace_names_the_group_size_and_no_rank():
    from sglang_glm_ext.l3.hicache.keys import ShardIdentity

    a = ShardIdentity(replicated=True, kv_shard_size=4)
    assert a.tag() == "replicated-pp0of1-kvshard4"
    assert ShardIdentity(replicated=True, kv_shard_size=8).tag() != a.tag()
    assert "kvshard" not in ShardIdentity(replicated=True).tag()


# ---------------------------------------------------------------------------------------- DCP
def test_sglang_refuses_l3_under_dcp_for_glms_pools():
    """GLM-5 (DSA: KV + indexer host pools) and GLM-4.x (MHA) cannot have any L3 under DCP in 0.5.23, whatever the
    backend: the indexer pool has no DCP translation and SGLang refuses it for every backend; MHA HiCache with DCP is
    refused at launch. Only plain MLA passes SGLang's checks, and then only for its file/Mooncake backends."""
    from sglang.srt.arg_groups import hicache_hook
    from sglang.srt.managers.cache_controller import HiCacheController

    attach_src = inspect.getsource(HiCacheController.attach_storage_backend)
    assert "HiCache L3 with DCP supports only MLA KV and optional KDA state." in attach_src
    assert 'if storage_backend not in ("file", "mooncake"):' in attach_src
    assert "HiCache with --dcp-size > 1 is only supported for MLA models" in inspect.getsource(
        hicache_hook.resolve_hicache_dcp_compatibility)


def test_dcp_is_refused_at_attach_with_the_reason(tmp_path):
    from sglang_glm_ext.l3.demo.pools import build_host_pools

    hp = build_host_pools("dsa", "page_first")
    with pytest.raises(AttachError, match="dcp_size=2.*indexer pool of GLM-5 for every backend"):
        attach(hp, write_config(tmp_path), tp_size=2, dcp_size=2)


def test_the_refusals_are_one_line_each():
    for why in (KV_SHARDING_REFUSED, DCP_REFUSED):
        assert "\n" not in why and len(why) < 400
