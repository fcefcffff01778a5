"""hicache/plan.py: every decision of one attach, made once from SGLang's real host pools (built on a CPU,
``demo/pools.py``) -- which pools are served as which payload kind and key tag, the namespace, the L3 rank and the
CP writers -- or the refusal that fails the attach before serving, the cheap refusals before SGLang's context is
read. Sidecar draft pools (present at attach or registered later) get their own records and never change the
namespace; a DSA layer-split part (an uneven one here: 5 layers over 2 ranks) names its layers and shard in it.

Expected values are derived from what the test built (layer counts, page sizes, SGLang's own flat page bytes) and
from the writer rule stated in cp_writers.py, not read back from the plan.
"""

from __future__ import annotations

import pytest

from sglang_glm_ext.l3.config import L3Config
from sglang_glm_ext.l3.disk.format import PayloadKind
from sglang_glm_ext.l3.hicache.cp_writers import Topology, TopologyError
from sglang_glm_ext.l3.hicache.extra_config import ALL_REPLICAS_WRITE_ATTR, SYNC_GROUPS_KEY, AttachError
from sglang_glm_ext.l3.hicache.keys import pool_tag
from sglang_glm_ext.l3.hicache.parts import DCP_REFUSED, LayerPart
from sglang_glm_ext.l3.hicache.plan import (KV, POOL_KINDS, SIDECAR_POOLS, AttachPlan, PoolRecord, plan_attach,
                                            plan_late_pool, sidecar_needs_weights)
from sglang_glm_ext.l3.hicache.pool_plans import LayoutRefused

from l3kit import write_config

pytestmark = pytest.mark.usefixtures("standins", "published")

ONE = Topology(tp_rank=0, tp_size=1)
WEIGHTS = "[payload_weights]\ntarget_kv = 0.6\nindex_k = 0.15\ndraft_kv = 0.15\ndraft_index_k = 0.1\n"


def pools(family, layout, **kw):
    """SGLang's host pools, booked against a fixed allowance (SGLang's host-RAM check would otherwise sample this
    shared machine's free memory)."""
    from sglang.srt.mem_cache.pool_host.base import host_memory_budget_scope

    from sglang_glm_ext.l3.demo.pools import build_host_pools

    with host_memory_budget_scope(1 << 30):
        return build_host_pools(family, layout, **kw)


def config_file(tmp_path, *, ranks=1, weights=False, name="l3"):
    path = write_config(tmp_path, name=name, **({"payload_split": "weights"} if weights else {}))
    text = open(path).read()
    if ranks != 1:
        assert "count = 1" in text
        text = text.replace("count = 1", f"count = {ranks}")
    if weights:
        text += WEIGHTS
    open(path, "w").write(text)
    return path


def setup(tmp_path, *, ranks=1, weights=False, **sc_kw):
    from sglang_glm_ext.l3.demo.pools import storage_config

    path = config_file(tmp_path, ranks=ranks, weights=weights)
    return storage_config(path, **sc_kw), L3Config.from_file(path)


def never(what):
    def called():
        raise AssertionError(f"{what} was read although a cheaper refusal applies")

    return called


def attach(sc, cfg, hp_pools, *, mode="cache", topology=ONE, kv_dtype="float8_e4m3fn", part=None):
    return plan_attach(sc, cfg, hp_pools, host_memory_mode=mode, topology=lambda: topology,
                       kv_dtype=lambda: kv_dtype, layer_part=lambda: part)


# ------------------------------------------------------------------------------------------------ what a plan holds
def test_a_plan_serves_every_pool_as_its_payload_kind_with_its_page_bytes(tmp_path):
    sc, cfg = setup(tmp_path)
    hp = pools("dsa", "page_first", layers=3)
    plan = attach(sc, cfg, hp.pools)
    assert set(plan.pools) == {"kv", "indexer"} and plan.kv is plan.pools[KV]
    for name, rec in plan.pools.items():
        assert isinstance(rec, PoolRecord) and rec.name == name and rec.kind == POOL_KINDS[name] and rec.tag is None
        assert rec.page_bytes == len(hp.page_bytes(name, 0))  # SGLang's own flat page of that pool
    assert plan.page_bytes() == {PayloadKind.TARGET_KV: len(hp.page_bytes("kv", 0)),
                                 PayloadKind.INDEX_K: len(hp.page_bytes("indexer", 0))}
    assert plan.rank == 0 and plan.topology == ONE
    assert plan.writers.writes_everything  # the only replica on its node writes every page


def test_the_namespace_names_the_model_dtype_layout_layers_and_pool_formats(tmp_path):
    sc, cfg = setup(tmp_path, model_name="glm-5-test")
    hp = pools("dsa", "layer_first", layers=4)
    plan = attach(sc, cfg, hp.pools, kv_dtype="float8_e5m2")
    ns = plan.namespace
    assert (ns.deployment_id, ns.model, ns.kv_dtype, ns.host_layout, ns.page_size) == \
        (cfg.deployment_id, "glm-5-test", "float8_e5m2", "layer_first", hp.page_size)
    assert (ns.layer_start, ns.layer_end) == (hp.kv.start_layer, hp.kv.start_layer + 4)  # [start, end): 4 layers
    assert [f.pool for f in ns.pools] == ["indexer", "kv"]  # sorted: the order pools were registered in is no part
    assert ns.pools == tuple(plan.pools[n].plan.fmt for n in ("indexer", "kv"))
    assert ns.shard.tag() == "replicated-pp0of1"  # MLA/DSA: the same bytes on every TP rank


def test_an_mha_rank_names_its_tp_shard_and_writes_its_own_pages(tmp_path):
    sc, cfg = setup(tmp_path, ranks=2, is_mla=False, tp_rank=1, tp_size=2)
    plan = attach(sc, cfg, pools("mha", "page_first").pools, topology=Topology(tp_rank=1, tp_size=2))
    assert plan.namespace.shard.tag() == "tp1of2-pp0of1"
    assert plan.rank == 1 and plan.writers.writers == (1,) and plan.writers.writes_everything


def test_the_plan_is_read_only_and_a_late_pool_makes_a_new_one(tmp_path):
    sc, cfg = setup(tmp_path, weights=True)
    hp = pools("dsa", "page_first")
    plan = attach(sc, cfg, hp.pools)
    with pytest.raises(TypeError):
        plan.pools["draft"] = plan.kv
    draft = pools("dsa", "page_first", layers=1)
    rec = plan_late_pool(cfg, "draft", draft.pools["kv"], hp.kv)
    bigger = plan.with_pool(rec)
    assert isinstance(bigger, AttachPlan) and set(bigger.pools) == {"kv", "indexer", "draft"}
    assert set(plan.pools) == {"kv", "indexer"}  # unchanged
    assert (bigger.namespace, bigger.rank, bigger.topology, bigger.writers) == \
        (plan.namespace, plan.rank, plan.topology, plan.writers)
    assert bigger.page_bytes()[PayloadKind.DRAFT_KV] == len(draft.page_bytes("kv", 0))


# ------------------------------------------------------------------------------------------------ sidecar pools
def _with_sidecars(hp):
    draft = pools("dsa", "page_first", layers=1)
    return {**hp.pools, "draft": draft.pools["kv"], "draft_indexer": draft.pools["indexer"]}


def test_sidecar_pools_are_bound_through_their_keys_never_the_namespace(tmp_path):
    sc, cfg = setup(tmp_path, weights=True)
    hp = pools("dsa", "page_first")
    without = attach(sc, cfg, hp.pools)
    plan = attach(sc, cfg, _with_sidecars(hp))
    for name in SIDECAR_POOLS:
        rec = plan.pools[name]
        assert rec.kind == POOL_KINDS[name] and rec.tag == pool_tag(rec.plan.fmt)
    assert plan.pools["draft"].tag != plan.pools["draft_indexer"].tag
    # SGLang registers them after the attach at startup and before it at a runtime attach: the same namespace.
    assert plan.namespace == without.namespace


def test_sidecar_pools_need_a_budget_rule_that_sizes_each_kind_alone(tmp_path):
    sc, cfg = setup(tmp_path)  # payload_split = equal_slots
    hp = pools("dsa", "page_first")
    with pytest.raises(AttachError) as exc:
        plan_attach(sc, cfg, _with_sidecars(hp), host_memory_mode="cache", topology=never("topology"),
                    kv_dtype=never("kv_dtype"), layer_part=never("layer_part"))
    assert str(exc.value) == sidecar_needs_weights(cfg)
    with pytest.raises(AttachError, match="payload_split = 'weights'"):
        plan_late_pool(cfg, "draft", hp.pools["indexer"], hp.kv)


def test_only_sidecar_draft_pools_may_come_after_the_store_opened(tmp_path):
    _, cfg = setup(tmp_path, weights=True)
    hp = pools("dsa", "page_first")
    for name in ("kv", "indexer", "swa"):
        with pytest.raises(AttachError, match=f"host pool '{name}'.*only the sidecar draft pools"):
            plan_late_pool(cfg, name, hp.pools["indexer"], hp.kv)


# ------------------------------------------------------------------------------------------------ refusals
def _refused(sc, cfg, hp_pools, mode="cache"):
    """The refusal, with SGLang's context never read (topology, kv dtype, layer part raise if called)."""
    return plan_attach(sc, cfg, hp_pools, host_memory_mode=mode, topology=never("topology"),
                       kv_dtype=never("kv_dtype"), layer_part=never("layer_part"))


def test_host_memory_other_than_the_cache_tier_is_refused_first(tmp_path):
    sc, cfg = setup(tmp_path)
    with pytest.raises(AttachError, match="buffer_only is not supported"):
        _refused(sc, cfg, {}, mode="buffer_only")  # before the pools are even looked at


def test_decode_context_parallelism_is_refused_with_the_reason(tmp_path):
    sc, cfg = setup(tmp_path, tp_size=2, dcp_size=2)
    with pytest.raises(AttachError, match="dcp_size=2") as exc:
        _refused(sc, cfg, pools("dsa", "page_first").pools)
    assert DCP_REFUSED in str(exc.value)


def test_an_attach_without_a_kv_pool_is_refused(tmp_path):
    sc, cfg = setup(tmp_path)
    with pytest.raises(AttachError, match="no KV host pool"):
        _refused(sc, cfg, {"indexer": pools("dsa", "page_first").pools["indexer"]})


def test_a_pool_it_does_not_serve_is_refused_by_name(tmp_path):
    sc, cfg = setup(tmp_path)
    hp = pools("dsa", "page_first")
    with pytest.raises(LayoutRefused, match="host pool 'swa'.*served pools: kv, indexer, draft, draft_indexer"):
        _refused(sc, cfg, {**hp.pools, "swa": hp.pools["indexer"]})


def test_pools_whose_pages_hold_other_token_counts_are_refused(tmp_path):
    sc, cfg = setup(tmp_path, weights=True)
    hp = pools("dsa", "page_first", page_size=64)
    small = pools("mla", "page_first", page_size=32)  # a draft model's KV pool of 32-token pages
    with pytest.raises(LayoutRefused, match="host pool 'draft' pages hold 32 tokens, KV pages 64"):
        _refused(sc, cfg, {**hp.pools, "draft": small.kv})
    with pytest.raises(LayoutRefused, match="pages hold 32 tokens"):  # registered after the attach: the same rule
        plan_late_pool(cfg, "draft", small.kv, hp.kv)


def test_a_topology_that_cannot_be_placed_on_a_node_is_an_attach_error(tmp_path):
    sc, cfg = setup(tmp_path)

    def unplaceable():
        raise TopologyError("tp_size 3 is not a multiple of attn_cp_size x attn_dp_size (2 x 1)")

    with pytest.raises(AttachError, match="cannot place this rank on a node: tp_size 3"):
        plan_attach(sc, cfg, pools("dsa", "page_first").pools, host_memory_mode="cache", topology=unplaceable,
                    kv_dtype=lambda: "bf16", layer_part=lambda: None)


def test_a_rank_past_the_configs_rank_count_is_refused(tmp_path):
    sc, cfg = setup(tmp_path, tp_rank=1, tp_size=2)  # ranks.count = 1
    with pytest.raises(AttachError, match="L3 rank 1 of its node.*ranks.count = 1"):
        attach(sc, cfg, pools("dsa", "page_first").pools, topology=Topology(tp_rank=1, tp_size=2))


def test_the_l3_rank_is_the_position_on_the_node_not_the_global_tp_rank(tmp_path):
    """TP 16 over two 8-GPU nodes: global TP rank 11 is the fourth process of the second node, L3 rank 3."""
    sc, cfg = setup(tmp_path, ranks=8, tp_rank=11, tp_size=16)
    setattr(sc, ALL_REPLICAS_WRITE_ATTR, True)
    topo = Topology(tp_rank=11, tp_size=16, nnodes=2)
    plan = attach(sc, cfg, pools("dsa", "page_first").pools, topology=topo)
    assert plan.rank == 11 - 8
    # Replicated pages with the writer patch: one owner per page among this node's replicas (TP ranks 8..15).
    assert plan.writers.writers == tuple(range(8, 16)) and plan.writers.me == 3


def test_replicas_across_nodes_without_the_writer_patch_are_refused(tmp_path):
    """Stock SGLang lets one rank write: the other node's L3 would stay empty."""
    sc, cfg = setup(tmp_path, ranks=8, tp_rank=1, tp_size=16)
    with pytest.raises(AttachError, match="span nodes.*16 replicas, 8 on this node"):
        attach(sc, cfg, pools("dsa", "page_first").pools, topology=Topology(tp_rank=1, tp_size=16, nnodes=2))
    # ... all on one node: SGLang's single writer writes what this node reads, so the rank writes what it gets
    sc, cfg = setup(tmp_path / "one", ranks=2, tp_rank=1, tp_size=2)
    plan = attach(sc, cfg, pools("dsa", "page_first").pools, topology=Topology(tp_rank=1, tp_size=2))
    assert plan.writers.writers == (1,) and plan.writers.writes_everything


# ------------------------------------------------------------------------------------------------ layer split
LAYERS = 5
PART1 = LayerPart(rank=1, size=2, layer_start=3, layer_end=5, device_layers=LAYERS, group_ranks=(0, 1))  # 3 + 2


def _split_sc(tmp_path, *, patch=True, groups=((0, 1),), mla=True):
    sc, cfg = setup(tmp_path, ranks=2, tp_rank=1, tp_size=2, attn_cp_rank=1, attn_cp_size=2, is_mla=mla,
                    user_extra={} if groups is None else {SYNC_GROUPS_KEY: [list(g) for g in groups]})
    if patch:
        setattr(sc, ALL_REPLICAS_WRITE_ATTR, True)
    return sc, cfg


SPLIT_TOPO = Topology(tp_rank=1, tp_size=2, attn_cp_size=2)


def test_a_layer_split_part_names_its_own_layers_and_shard_and_writes_its_part_itself(tmp_path):
    sc, cfg = _split_sc(tmp_path)
    hp = pools("dsa", "layer_first", layers=3)  # ceil(5 / 2) host layers per page
    plan = attach(sc, cfg, hp.pools, topology=SPLIT_TOPO, part=PART1)
    assert (plan.namespace.layer_start, plan.namespace.layer_end) == (3, 5)  # the part, not the pool's layers
    assert plan.namespace.shard.tag() == "replicated-pp0of1-lsplit1of2"
    assert plan.topology.cp_parts and plan.rank == 1
    # Its attention-TP replicas hold the same part: with attention TP 1 it is the only one, and writes it all.
    assert plan.writers.writers == (1,) and plan.writers.writes_everything
    plain = attach(*_split_sc(tmp_path / "plain"), hp.pools, topology=SPLIT_TOPO, part=None)
    assert plain.namespace.sealed_digest() != plan.namespace.sealed_digest()


@pytest.mark.parametrize("kw,match", [
    (dict(mla=False), "does not call rank-replicated"),
    (dict(patch=False), "cp_storage_writers patch is not in place"),
    (dict(groups=None), "storage MIN groups are unknown"),
    (dict(groups=((0,), (1,))), r"\[0, 1\] are not all in one of"),
    (dict(groups=()), "not all in one of"),
])
def test_a_layer_split_that_could_leave_a_part_unwritten_or_unchecked_is_refused(tmp_path, kw, match):
    sc, cfg = _split_sc(tmp_path, **kw)
    with pytest.raises(AttachError, match=match):
        attach(sc, cfg, pools("dsa", "layer_first", layers=3).pools, topology=SPLIT_TOPO, part=PART1)


def test_a_part_of_another_attention_cp_rank_than_the_published_one_is_refused(tmp_path):
    sc, cfg = _split_sc(tmp_path)
    part0 = LayerPart(0, 2, 0, 3, LAYERS, (0, 1))
    with pytest.raises(AttachError, match="layer-shard rank 0 but attention-CP rank 1"):
        attach(sc, cfg, pools("dsa", "layer_first", layers=3).pools, topology=SPLIT_TOPO, part=part0)


def test_pool_kinds_cover_every_pool_sglang_may_register_for_glm():
    assert POOL_KINDS == {"kv": PayloadKind.TARGET_KV, "indexer": PayloadKind.INDEX_K,
                          "draft": PayloadKind.DRAFT_KV, "draft_indexer": PayloadKind.DRAFT_INDEX_K}
    assert set(SIDECAR_POOLS) < set(POOL_KINDS) and KV not in SIDECAR_POOLS
