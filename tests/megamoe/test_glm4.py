"""A GLM-4 block's MegaMoE plan and the arguments handed to SGLang's run_mega_routed_experts."""

import inspect
from types import SimpleNamespace

import pytest
import torch

from sglang_glm_ext.megamoe.glm4 import PlanError, plan_block, runner_kwargs
from sglang_glm_ext.megamoe.routing import kernel_routing


def block(*, fused=0, replicated=True, tp=2, per_partition=128, swiglu_limit=None):
    cfg = SimpleNamespace(num_experts_per_tok=8, moe_intermediate_size=128, hidden_size=256, n_shared_experts=1,
                          routed_scaling_factor=2.5)
    experts = SimpleNamespace(num_experts=160 + fused, intermediate_size_per_partition=per_partition,
                              moe_runner_config=SimpleNamespace(swiglu_limit=swiglu_limit))
    shared = SimpleNamespace(is_replicated=replicated) if fused == 0 else None
    return SimpleNamespace(config=cfg, experts=experts, layer_id=4, num_fused_shared_experts=fused,
                           shared_experts=shared, tp_size=tp)


def test_plan_of_a_glm4_block():
    p = plan_block(block(), scale_fused_in_topk=False, moe_ep_size=2, name="model.layers.4.mlp")
    assert (p.top_k, p.num_experts, p.hidden_size, p.intermediate_size) == (8, 160, 256, 128)
    assert p.routed_scaling_factor == 2.5 and not p.scale_fused_in_topk and p.has_separate_shared
    assert "model.layers.4.mlp" in p.layer and "layer 4" in p.layer


def test_fused_shared_expert_widens_the_kernel_top_k_at_ep1_and_is_refused_above():
    p = plan_block(block(fused=1), scale_fused_in_topk=False, moe_ep_size=1)
    assert p.top_k == 9 and p.num_experts == 161 and not p.has_separate_shared
    with pytest.raises(PlanError, match="disable-shared-experts-fusion"):
        plan_block(block(fused=1), scale_fused_in_topk=False, moe_ep_size=8)


def test_tp_sharded_shared_expert_or_split_experts_are_refused():
    with pytest.raises(PlanError, match="TP-sharded"):
        plan_block(block(replicated=False), scale_fused_in_topk=False, moe_ep_size=2)
    plan_block(block(replicated=False, tp=1), scale_fused_in_topk=False, moe_ep_size=1)  # tp=1: one shard is all
    with pytest.raises(PlanError, match="whole experts"):
        plan_block(block(per_partition=64), scale_fused_in_topk=False, moe_ep_size=2)


def test_runner_kwargs_match_sglang_run_mega_routed_experts():
    from sglang.srt.layers.moe.mega_moe import run_mega_routed_experts

    p = plan_block(block(swiglu_limit=7.0), scale_fused_in_topk=False, moe_ep_size=2)
    kr = kernel_routing(torch.zeros(3, 8, dtype=torch.int32), torch.ones(3, 8), num_tokens=3, top_k=8,
                        num_experts=160, routed_scaling_factor=2.5, scale_fused_in_topk=False)
    kw = runner_kwargs(p, kr)
    params = inspect.signature(run_mega_routed_experts).parameters
    assert set(kw) <= set(params) and all(params[k].kind is inspect.Parameter.KEYWORD_ONLY for k in kw)
    assert kw["top_k"] == 8 and kw["num_tokens"] == 3 and kw["routed_scaling_factor"] == 2.5
    assert kw["activation_clamp"] == 7.0 and kw["num_shared_experts"] == 0 and kw["shared_l1_weights"] is None
    fused = plan_block(block(), scale_fused_in_topk=True, moe_ep_size=2)
    kr1 = kernel_routing(torch.zeros(3, 8, dtype=torch.int32), torch.ones(3, 8), num_tokens=3, top_k=8,
                         num_experts=160, routed_scaling_factor=fused.routed_scaling_factor,
                         scale_fused_in_topk=True)
    assert runner_kwargs(fused, kr1)["routed_scaling_factor"] == 1.0
    with pytest.raises(PlanError, match="columns"):
        runner_kwargs(p, kernel_routing(torch.zeros(3, 9, dtype=torch.int32), torch.ones(3, 9), num_tokens=3,
                                        top_k=9, num_experts=160, routed_scaling_factor=1.0,
                                        scale_fused_in_topk=False))
