"""hicache/sglang_pools.py: what the backend reads off SGLang at attach, on SGLang's real host pools (built on a CPU
the way its assembler builds them, ``demo/pools.py``) and its real runtime context.

The geometry's meaning is checked against SGLang itself: the plan made of it must reproduce, byte for byte, the
page SGLang's own ``get_data_page`` returns (or the page's block of the buffer, for page_unified), for every family,
layout and packed-draft count; its row width must be what the buffer's size says. Refusals name the pool. The
KV dtype, topology, host-memory mode and DSA layer-split part are read from where SGLang keeps them, published
values before the storage config's view, and disagreements refuse the attach.
"""

from __future__ import annotations

import dataclasses
import enum
import types

import numpy as np
import pytest
import torch

from sglang_glm_ext.l3.hicache import sglang_pools
from sglang_glm_ext.l3.hicache.cp_writers import Topology, TopologyError
from sglang_glm_ext.l3.hicache.extra_config import AttachError
from sglang_glm_ext.l3.hicache.parts import DCP_REFUSED, LayerPart
from sglang_glm_ext.l3.hicache.pool_plans import Buffer, LayoutRefused, plan_pool

import leakguard
from l3kit import write_config

pytestmark = pytest.mark.usefixtures("standins", "published")


@pytest.fixture
def republished():
    """For a test that publishes its own server args (a layer-split layout): the module's are back when it ends."""
    with leakguard.kept():
        yield


def pools(family, layout, **kw):
    """SGLang's host pools, a few MiB each, booked against a fixed allowance: SGLang's host-RAM check would
    otherwise sample this shared machine's free memory, which other processes move."""
    from sglang.srt.mem_cache.pool_host.base import host_memory_budget_scope

    from sglang_glm_ext.l3.demo.pools import build_host_pools

    with host_memory_budget_scope(1 << 30):
        return build_host_pools(family, layout, **kw)


def sconfig(tmp_path, **kw):
    from sglang_glm_ext.l3.demo.pools import storage_config

    return storage_config(write_config(tmp_path), **kw)


def payload(plan, page) -> bytes:
    out = np.zeros(plan.page_bytes, dtype=np.uint8)
    plan.layout.gather_into(page, out)
    return out.tobytes()


def sglang_page(hp, name, page) -> bytes:
    """SGLang's own bytes of one host page: get_data_page, or for page_unified (which has none) the page's block."""
    pool = hp.pools[name]
    if pool.layout == "page_unified":
        buf = pool.kv_buffer.view(-1).view(torch.uint8)
        blk = buf.numel() // pool.page_num
        return bytes(buf[page * blk:(page + 1) * blk].numpy())
    return hp.page_bytes(name, page)


# ------------------------------------------------------------------------------------------------ pool_name
def test_pool_name_is_the_string_sglang_means():
    from sglang.srt.mem_cache.hicache_storage import PoolName

    class Numbered(enum.Enum):
        THREE = 3

    assert sglang_pools.pool_name(PoolName.DRAFT_INDEXER) == "draft_indexer"
    assert sglang_pools.pool_name("kv") == "kv"
    assert sglang_pools.pool_name(Numbered.THREE) == "3"


# ------------------------------------------------------------------------------------------------ pool_geometry
GEOMETRIES = [
    ("dsa", "page_first", 0), ("dsa", "layer_first", 0), ("dsa", "page_first_direct", 0),
    ("dsa", "page_first", 1), ("dsa", "layer_first", 2),  # NextN draft layers packed into KV and indexer pages
    ("mla", "page_first", 0), ("mla", "page_unified", 0),
    ("mha", "layer_first", 0), ("mha", "page_first", 0), ("mha", "page_head", 0), ("mha", "page_unified", 0),
]


@pytest.mark.parametrize("family,layout,drafts", GEOMETRIES, ids=[f"{f}-{la}-d{d}" for f, la, d in GEOMETRIES])
def test_the_geometry_read_off_a_pool_reproduces_sglangs_own_pages(family, layout, drafts):
    hp = pools(family, layout, layers=3, draft_layers=drafts)
    hp.fill_random(21)
    for name, pool in hp.pools.items():
        g = sglang_pools.pool_geometry(name, pool)
        assert (g.name, g.layout, g.page_size) == (name, layout, hp.page_size)
        assert g.layers == 3 + drafts and g.draft_layers == drafts
        plan = plan_pool(g)
        for page in (0, 1, g.num_pages - 1):
            assert payload(plan, page) == sglang_page(hp, name, page), (name, page)


@pytest.mark.parametrize("family,row", [("dsa", 656), ("mla", 576)])
def test_an_mla_row_is_the_bytes_of_one_token_of_one_layer(family, row):
    """GLM-5's DSA-packed fp8 rows are 656 B, plain MLA's 576 B (512 + 64 one-byte elements): and the buffer holds
    exactly pages x tokens x layers of them."""
    hp = pools(family, "page_first")
    g = sglang_pools.pool_geometry("kv", hp.kv)
    assert g.family == "mla" and g.row_bytes == row
    (buf,) = g.buffers
    assert buf == Buffer(hp.kv.kv_buffer.data_ptr(), hp.kv.kv_buffer.nbytes)
    assert buf.nbytes == g.num_pages * g.page_size * g.layers * row


def test_mha_reads_k_and_v_as_two_buffers_unless_the_page_is_one_block():
    hp = pools("mha", "layer_first", head_num=2, head_dim=64)
    g = sglang_pools.pool_geometry("kv", hp.kv)
    item = hp.kv.dtype.itemsize
    assert g.family == "mha" and g.row_bytes == g.v_row_bytes == 2 * 64 * item
    assert g.buffers == (Buffer(hp.kv.k_buffer.data_ptr(), hp.kv.k_buffer.nbytes),
                         Buffer(hp.kv.v_buffer.data_ptr(), hp.kv.v_buffer.nbytes))
    unified = pools("mha", "page_unified")
    g = sglang_pools.pool_geometry("kv", unified.kv)
    assert len(g.buffers) == 1 and g.unified_page_bytes * g.num_pages == unified.kv.kv_buffer.nbytes


def test_a_pool_class_it_does_not_serve_is_refused_by_name():
    class MambaPoolHost:
        layout = "page_first"

    with pytest.raises(LayoutRefused, match=r"host pool 'mamba' \(.*MambaPoolHost\) is not served by L3"):
        sglang_pools.pool_geometry("mamba", MambaPoolHost())


def test_a_pool_under_decode_context_parallelism_is_refused():
    hp = pools("dsa", "page_first")
    hp.kv.dcp_size = 2  # what SGLang's host pool records under --dcp-size 2
    with pytest.raises(LayoutRefused, match="dcp_size=2") as exc:
        sglang_pools.pool_geometry("kv", hp.kv)
    assert DCP_REFUSED in str(exc.value)


def test_an_allocator_only_mla_pool_holds_nothing_to_store():
    hp = pools("mla", "page_first")
    hp.kv._is_dummy = True
    with pytest.raises(LayoutRefused, match="allocator-only MLA host pool"):
        sglang_pools.pool_geometry("kv", hp.kv)
    hp = pools("mla", "page_first")
    hp.kv.kv_buffer = None
    with pytest.raises(LayoutRefused, match="allocator-only"):
        sglang_pools.pool_geometry("kv", hp.kv)


def test_the_split_kv_layout_of_mla_is_refused_with_the_written_decision():
    hp = pools("mla", "page_first")
    hp.kv.layout = "page_first_kv_split"
    with pytest.raises(LayoutRefused, match="page_first_kv_split.*not served"):
        sglang_pools.pool_geometry("kv", hp.kv)


# ------------------------------------------------------------------------------------------------ pointers
@pytest.mark.parametrize("family,layout", [("dsa", "page_first"), ("dsa", "layer_first"), ("mha", "layer_first"),
                                           ("mha", "page_head")])
def test_a_true_plan_agrees_with_sglangs_pointers(family, layout):
    hp = pools(family, layout)
    for name, pool in hp.pools.items():
        plan = plan_pool(sglang_pools.pool_geometry(name, pool))
        assert sglang_pools.check_against_sglang_pointers(plan, pool, hp.kv.page_num) == ""


@pytest.mark.parametrize("family,layout", [("dsa", "page_first"), ("mha", "page_head")])
def test_a_plan_that_misplaces_the_pages_is_caught_by_sglangs_pointers(family, layout):
    """A geometry one page off (what a SGLang change of the layout would look like to the plugin)."""
    hp = pools(family, layout)
    g = sglang_pools.pool_geometry("kv", hp.kv)
    blk = g.page_size * g.layers * g.row_bytes
    shifted = dataclasses.replace(g, buffers=tuple(Buffer(b.address + blk, b.nbytes) for b in g.buffers))
    why = sglang_pools.check_against_sglang_pointers(plan_pool(shifted), hp.kv, hp.kv.page_num)
    assert why.startswith("page 0: SGLang's get_page_buffer_meta gives") and "SGLang changed?" in why


def test_a_layout_sglang_has_no_pointers_for_leaves_the_plan_standing_alone():
    hp = pools("dsa", "layer_first")  # SGLang's indexer pool has no zero-copy pointers in layer_first
    idx = hp.pools["indexer"]
    g = sglang_pools.pool_geometry("indexer", idx)
    shifted = dataclasses.replace(g, buffers=(Buffer(g.buffers[0].address + 64, g.buffers[0].nbytes),))
    assert sglang_pools.check_against_sglang_pointers(plan_pool(shifted), idx, hp.kv.page_num) == ""
    assert sglang_pools.check_against_sglang_pointers(plan_pool(g), types.SimpleNamespace(), 4) == ""


# ------------------------------------------------------------------------------------------------ kv_dtype
def test_the_kv_dtype_the_plugins_hook_wrote_wins(tmp_path):
    hp = pools("dsa", "page_first")
    assert sglang_pools.kv_dtype(sconfig(tmp_path, kv_dtype="bfloat16"), hp.pools) == "bfloat16"


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2"])
def test_without_the_hook_the_indexers_device_pool_knows_the_kv_dtype(tmp_path, dtype):
    hp = pools("dsa", "page_first", kv_dtype=dtype)
    assert sglang_pools.kv_dtype(sconfig(tmp_path, kv_dtype=None), hp.pools) == dtype


def test_an_unknown_kv_dtype_refuses_the_attach(tmp_path):
    with pytest.raises(AttachError, match="KV dtype is unknown"):
        sglang_pools.kv_dtype(sconfig(tmp_path, kv_dtype=None), pools("mha", "page_first").pools)


# ------------------------------------------------------------------------------------------------ topology / mode
def test_the_published_topology_wins_over_the_storage_configs_view(tmp_path):
    from sglang.srt.runtime_context import get_parallel

    sc = sconfig(tmp_path)  # tp_rank 0 of 1
    with get_parallel().override(tp_rank=1, tp_size=2, attn_tp_size=2, moe_tp_size=2):
        t = sglang_pools.topology(sc)
    assert (t.tp_rank, t.tp_size, t.pp_rank, t.pp_size, t.attn_cp_size, t.nnodes) == (1, 2, 0, 1, 1, 1)


def test_with_nothing_published_the_storage_configs_view_is_used(tmp_path, monkeypatch):
    import sglang.srt.runtime_context as rc

    def unpublished():
        raise RuntimeError("nothing published")

    monkeypatch.setattr(rc, "get_parallel", unpublished)
    sc = sconfig(tmp_path, tp_rank=3, tp_size=4, attn_cp_rank=3, attn_cp_size=2)
    assert sglang_pools.topology(sc) == Topology(tp_rank=3, tp_size=4, pp_rank=0, pp_size=1, attn_cp_size=2)


def test_a_published_topology_that_cannot_be_placed_is_not_papered_over(tmp_path, monkeypatch):
    import sglang.srt.runtime_context as rc

    bad = types.SimpleNamespace(tp_rank=0, tp_size=3, pp_rank=0, pp_size=1, attn_cp_size=2, attn_dp_size=1, nnodes=1)
    monkeypatch.setattr(rc, "get_parallel", lambda: bad)
    with pytest.raises(TopologyError, match="not a multiple"):  # not the storage config's (valid) view instead
        sglang_pools.topology(sconfig(tmp_path))


def test_the_host_memory_mode_is_the_published_one_else_the_cache_default(monkeypatch):
    from sglang.srt.runtime_context import get_memory

    assert sglang_pools.host_memory_mode() == get_memory().hicache_host_memory_mode == "cache"
    with get_memory().override(hicache_host_memory_mode="buffer_only"):
        assert sglang_pools.host_memory_mode() == "buffer_only"
    import sglang.srt.runtime_context as rc

    monkeypatch.setattr(rc, "get_memory", lambda: (_ for _ in ()).throw(RuntimeError("nothing published")))
    assert sglang_pools.host_memory_mode() == "cache"


# ------------------------------------------------------------------------------------------------ layer_part
def test_pools_that_are_not_layer_split_have_no_part(tmp_path):
    sc = sconfig(tmp_path)
    assert sglang_pools.layer_part(sc, pools("dsa", "page_first").pools) is None
    assert sglang_pools.layer_part(sc, pools("mha", "layer_first").pools) is None


def test_a_kv_pool_and_an_indexer_that_disagree_about_the_split_refuse_the_attach(tmp_path):
    hp = pools("dsa", "page_first")
    hp.pools["indexer"].device_pool.layer_shard_enabled = True
    with pytest.raises(AttachError, match="pools disagree"):
        sglang_pools.layer_part(sconfig(tmp_path), hp.pools)


LAYERS = 5  # uneven over 2 ranks: 3 + 2


def _split_rank(tmp_path, rank, size, layout="layer_first", *, sc_cp=None, group=None):
    """Build rank ``rank``'s layer-split pools through SGLang and read its part, inside its published topology
    (``group``: another published attention-CP group object to read it under)."""
    from sglang.srt.runtime_context import get_parallel

    from sglang_glm_ext.l3.demo import stack

    stack.publish_server_args(stack.StackSpec(layout=layout), storage_backend=None, extra_config=None)
    cp_rank, cp_size = sc_cp or (rank, size)
    sc = sconfig(tmp_path, tp_rank=rank, tp_size=size, attn_cp_rank=cp_rank, attn_cp_size=cp_size)
    published = stack.layer_split_parallel(rank, size)
    with get_parallel().override(**published):
        hp = pools("dsa", layout, layers=LAYERS, layer_split=(rank, size))
    if group is not None:
        published["attn_cp_group"] = group
    with get_parallel().override(**published):
        return hp, sglang_pools.layer_part(sc, hp.pools)


@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
def test_each_rank_of_an_uneven_split_reads_its_own_layers_and_together_they_hold_every_layer(tmp_path, layout,
                                                                                              republished):
    from sglang.srt.layers.cp.utils import get_layer_shard_range

    parts = []
    for rank in range(2):
        hp, part = _split_rank(tmp_path / str(rank), rank, 2, layout)
        start, end = get_layer_shard_range(rank, 2, LAYERS)
        assert part == LayerPart(rank, 2, start, end, LAYERS, (0, 1))
        assert part.host_layers == 3 == hp.kv.target_layer_num  # ceil(5 / 2): the smaller part is padded
        parts.append(part)
    owned = [layer for p in parts for layer in range(p.layer_start, p.layer_end)]
    assert sorted(owned) == list(range(LAYERS))  # every layer, each on one rank


def test_a_storage_config_that_places_the_rank_elsewhere_refuses_the_attach(tmp_path, republished):
    with pytest.raises(AttachError, match="differs between"):
        _split_rank(tmp_path, 0, 2, sc_cp=(1, 2))


def test_a_published_group_that_names_no_ranks_refuses_the_attach(tmp_path, republished):
    """The group's ranks are the holders of the page's other parts (the MIN-coverage check needs them): a group
    object that does not name them cannot place the part."""
    with pytest.raises(AttachError, match=r"names ranks \[\], 2 expected"):
        _split_rank(tmp_path, 0, 2, group=types.SimpleNamespace(rank_in_group=0))


def test_allocator_only_names_sglangs_buffer_less_pools_and_nothing_else():
    hp = pools("mla", "page_first")
    assert not sglang_pools.allocator_only(hp.kv)
    hp.kv._is_dummy = True
    assert sglang_pools.allocator_only(hp.kv)
