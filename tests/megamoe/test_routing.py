"""Router output -> kernel routing; the plugin's GLM router rule equals SGLang's select_experts."""

import pytest
import torch

from sglang.srt.layers.moe.topk import BypassedTopKOutput, TopKConfig, select_experts

from sglang_glm_ext.megamoe.routing import RoutingError, glm_grouped_topk, kernel_routing


def glm_topk_config(bias, *, apply_on_output, top_k=4, groups=4, topk_group=2, rsf=2.5):
    return TopKConfig(top_k=top_k, use_grouped_topk=True, topk_group=topk_group, num_expert_group=groups,
                      renormalize=True, correction_bias=bias, routed_scaling_factor=rsf,
                      apply_routed_scaling_factor_on_output=apply_on_output, layer_id=0)


def _sorted(ids, weights):
    order = ids.argsort(dim=-1)
    return ids.gather(1, order), weights.gather(1, order)


@pytest.mark.parametrize("apply_on_output", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_glm_grouped_topk_equals_sglang_select_experts(seed, apply_on_output):
    g = torch.Generator().manual_seed(seed)
    tokens, experts = 33, 16
    logits = torch.randn(tokens, experts, generator=g) * 2
    bias = torch.randn(experts, generator=g) * 0.3
    hidden = torch.randn(tokens, 128, generator=g)
    ref = select_experts(hidden, logits, glm_topk_config(bias, apply_on_output=apply_on_output), layer_id=0)
    w, ids = glm_grouped_topk(logits, bias, top_k=4, num_expert_group=4, topk_group=2, renormalize=True,
                              routed_scaling_factor=2.5, apply_routed_scaling_factor_on_output=apply_on_output)
    got_ids, got_w = _sorted(ids, w)
    ref_ids, ref_w = _sorted(ref.topk_ids.to(torch.int32), ref.topk_weights.float())
    assert torch.equal(got_ids, ref_ids)
    torch.testing.assert_close(got_w, ref_w, rtol=1e-6, atol=1e-6)


def test_glm_grouped_topk_of_an_empty_batch_is_empty_of_the_right_width():
    # An idle rank (0 tokens) still routes: [0, top_k] ids and weights, no error (a view with -1 raised here).
    w, ids = glm_grouped_topk(torch.randn(0, 16), torch.zeros(16), top_k=8, num_expert_group=4, topk_group=2,
                              renormalize=True)
    assert tuple(ids.shape) == (0, 8) and ids.dtype == torch.int32
    assert tuple(w.shape) == (0, 8) and w.dtype == torch.float32


def test_bypassed_routing_materialises_to_the_same_ids_and_weights():
    # What the GLM-4 hook does with a FlashInfer-TRTLLM bypassed TopK: SGLang's own to_standard().
    g = torch.Generator().manual_seed(7)
    logits, bias, hidden = torch.randn(9, 16, generator=g), torch.randn(16, generator=g) * 0.2, torch.randn(9, 128)
    cfg = glm_topk_config(bias, apply_on_output=False)
    std = BypassedTopKOutput(hidden, logits, cfg).to_standard(0)
    w, ids = glm_grouped_topk(logits, bias, top_k=4, num_expert_group=4, topk_group=2, renormalize=True)
    assert torch.equal(_sorted(ids, w)[0], _sorted(std.topk_ids.to(torch.int32), std.topk_weights)[0])


def test_kernel_routing_dtypes_and_scale_once():
    ids = torch.tensor([[1, 2], [3, 0]], dtype=torch.int64)
    w = torch.tensor([[0.5, 0.5], [0.25, 0.75]], dtype=torch.bfloat16)
    kr = kernel_routing(ids, w, num_tokens=2, top_k=2, num_experts=4, routed_scaling_factor=2.5,
                        scale_fused_in_topk=False, check_ids=True)
    assert kr.topk_ids.dtype == torch.int32 and kr.topk_weights.dtype == torch.float32
    assert kr.routed_scaling_factor == 2.5 and torch.equal(kr.topk_weights, w.float())  # the kernel scales
    fused = kernel_routing(ids, w, num_tokens=2, top_k=2, num_experts=4, routed_scaling_factor=2.5,
                           scale_fused_in_topk=True)
    assert fused.routed_scaling_factor == 1.0  # already in the weights: never twice
    assert kernel_routing(ids, w, num_tokens=2, top_k=2, num_experts=4, routed_scaling_factor=None,
                          scale_fused_in_topk=False).routed_scaling_factor == 1.0


def test_kernel_routing_empty_rank_gets_empty_routing_of_the_kernel_width():
    kr = kernel_routing(None, None, num_tokens=0, top_k=9, num_experts=257, routed_scaling_factor=2.5,
                        scale_fused_in_topk=False, device=torch.device("cpu"))
    assert kr.topk_ids.shape == (0, 9) and kr.topk_ids.dtype == torch.int32
    assert kr.topk_weights.shape == (0, 9) and kr.topk_weights.dtype == torch.float32


def test_kernel_routing_fused_shared_columns_count_in_the_width():
    ids = torch.tensor([[0, 3, 8]])  # 2 routed + the fused shared slot (expert 8 of 9)
    kr = kernel_routing(ids, torch.ones(1, 3), num_tokens=1, top_k=3, num_experts=9, routed_scaling_factor=2.5,
                        scale_fused_in_topk=False, check_ids=True)
    assert kr.top_k == 3
    with pytest.raises(RoutingError, match="fused shared"):
        kernel_routing(ids, torch.ones(1, 3), num_tokens=1, top_k=2, num_experts=9, routed_scaling_factor=1.0,
                       scale_fused_in_topk=False)


def test_kernel_routing_rejects_bad_routing():
    with pytest.raises(RoutingError, match="no routing"):
        kernel_routing(None, None, num_tokens=3, top_k=2, num_experts=4, routed_scaling_factor=1.0,
                       scale_fused_in_topk=False)
    with pytest.raises(RoutingError, match="outside"):
        kernel_routing(torch.tensor([[0, 4]]), torch.ones(1, 2), num_tokens=1, top_k=2, num_experts=4,
                       routed_scaling_factor=1.0, scale_fused_in_topk=False, check_ids=True)
    ok = kernel_routing(torch.tensor([[0, -1]]), torch.ones(1, 2), num_tokens=1, top_k=2, num_experts=4,
                        routed_scaling_factor=1.0, scale_fused_in_topk=False, check_ids=True)
    assert ok.topk_ids.tolist() == [[0, -1]]  # -1: a dropped padded row, which the kernel skips
