"""host_dedup/plan.py: who is the source of each group, per node, and why a launch does not run deduplicated."""

import pytest

from sglang_glm_ext.host_dedup.plan import Facts, decide, dedup_groups, plan_digest, resolve_mode


def on(**kw):
    return Facts(mode="on", storage="l3", **kw)


def test_auto_and_unset_stay_off_until_a_benchmark_decides_and_off_is_off():
    assert resolve_mode(None) == "auto"
    for mode in ("auto", "off"):
        plan = decide(Facts(mode=mode, tp_size=8, attn_cp_size=8))
        assert not plan.on and not plan.is_peer and plan.is_source
    assert "auto" in decide(Facts(mode="auto", tp_size=8, attn_cp_size=8)).why_not
    with pytest.raises(ValueError):
        resolve_mode("yes")


def test_one_node_cp_group_has_rank_0_as_source_and_every_other_rank_a_peer():
    for r in range(4):
        plan = decide(on(tp_rank=r, tp_size=4, attn_cp_size=4))
        assert plan.on and plan.group == (0, 1, 2, 3) and plan.source == 0
        assert plan.is_peer == (r != 0)


def test_a_tp_group_spanning_nodes_gets_one_source_per_node():
    groups = dedup_groups(on(tp_size=16, nnodes=2, attn_cp_size=16))
    assert groups == (tuple(range(8)), tuple(range(8, 16)))
    plan = decide(on(tp_rank=11, tp_size=16, nnodes=2, attn_cp_size=16))
    assert plan.source == 8 and plan.is_peer
    assert decide(on(tp_rank=8, tp_size=16, nnodes=2, attn_cp_size=16)).is_source


def test_attention_dp_replicas_and_pipeline_stages_are_never_merged():
    # TP 8 = attention DP 2 x attention TP 4: two groups, each its own source
    groups = dedup_groups(on(tp_size=8, attn_dp_size=2))
    assert groups == ((0, 1, 2, 3), (4, 5, 6, 7))
    # PP 2 on 2 nodes, TP 4 each: one group per stage, global ranks pp * tp_size + tp
    plan = decide(on(tp_rank=2, tp_size=4, pp_rank=1, pp_size=2, nnodes=2, attn_cp_size=4))
    assert plan.group == (4, 5, 6, 7) and plan.me == 6 and plan.source == 4
    assert plan.groups == ((0, 1, 2, 3), (4, 5, 6, 7))  # every rank creates both, in this order


@pytest.mark.parametrize("facts, word", [
    (dict(mla=False), "MHA"), (dict(layer_split=True), "layer split"), (dict(fp4_kv=True), "FP4"),
    (dict(speculative=True), "draft"), (dict(dcp=True), "decode context"), (dict(kv_sharding=True), "sharding"),
    (dict(attn_cp_size=1, attn_dp_size=4), "only replica"),
])
def test_each_excluded_deployment_says_why(facts, word):
    plan = decide(on(**{"tp_rank": 1, "tp_size": 4, "attn_cp_size": 4, **facts}))
    assert not plan.on and not plan.is_peer and word in plan.why_not


def test_a_storage_backend_that_would_read_allocator_only_pools_is_refused():
    plan = decide(Facts(mode="on", storage="file", tp_rank=1, tp_size=4, attn_cp_size=4))
    assert not plan.on and "storage backend 'file'" in plan.why_not


def test_no_storage_is_served_too():
    assert decide(Facts(mode="on", tp_rank=1, tp_size=2, attn_cp_size=2)).is_peer


def test_the_plan_digest_agrees_only_on_the_same_plan():
    a = plan_digest(b"\x01\x00" * 64)
    assert a == plan_digest(b"\x01\x00" * 64)
    assert a != plan_digest(b"\x02\x00" * 64) and a != plan_digest(b"\x01\x00" * 64, b"")
    assert -(2 ** 62) <= a < 2 ** 62  # its negation fits the int64 the group reduces
