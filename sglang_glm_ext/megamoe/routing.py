"""Router output -> the MegaMoE kernel's expert ids and weights. Pure torch; no SGLang import.

SGLang's TopK produces the routing (grouped top-k with the score-correction bias, routed scaling, fused
shared-expert columns); when a FlashInfer TRTLLM runner bypassed routing, the hook first materialises it with
SGLang's own `BypassedTopKOutput.to_standard()`. What reaches this module is a standard (ids, weights) pair;
`kernel_routing` brings it to the form DeepGEMM's pre-dispatch takes (int32 ids, fp32 weights, [T, top_k]) and
says which routed-scaling factor the kernel still has to apply. `glm_grouped_topk` is GLM's router rule in plain
torch, pinned equal to SGLang's `select_experts` by tests/megamoe/test_routing.py; it serves where SGLang
cannot run (the GPU check in scripts/gpu/) and as the test oracle, never on the serving path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


class RoutingError(ValueError):
    """The router's output does not fit the kernel's routing contract (a plugin or SGLang bug, never data)."""


@dataclass(frozen=True)
class KernelRouting:
    """Routing in the kernel's form. Invariants: ids int32 and weights fp32, both [num_tokens, top_k];
    `routed_scaling_factor` is what the kernel must still multiply the weights by (1.0 when the router already
    folded it in)."""

    topk_ids: torch.Tensor
    topk_weights: torch.Tensor
    routed_scaling_factor: float
    top_k: int
    num_tokens: int


def kernel_routing(
    topk_ids: Optional[torch.Tensor],
    topk_weights: Optional[torch.Tensor],
    *,
    num_tokens: int,
    top_k: int,
    num_experts: int,
    routed_scaling_factor: Optional[float],
    scale_fused_in_topk: bool,
    device: Optional[torch.device] = None,
    check_ids: bool = False,
) -> KernelRouting:
    """Standard top-k output -> KernelRouting.

    `top_k` is the kernel's width: routed experts plus fused shared-expert columns. A rank with no tokens still
    joins the collective kernel, with empty [0, top_k] routing. `check_ids` (tests, debugging) verifies every id
    is -1 (a dropped padded row) or a valid expert; it reads the tensor, so it syncs a GPU.
    """
    scale = 1.0 if scale_fused_in_topk or not routed_scaling_factor else float(routed_scaling_factor)
    if num_tokens == 0:
        dev = device if device is not None else (topk_ids.device if topk_ids is not None else torch.device("cpu"))
        return KernelRouting(
            torch.empty((0, top_k), dtype=torch.int32, device=dev),
            torch.empty((0, top_k), dtype=torch.float32, device=dev),
            scale, top_k, 0,
        )
    if topk_ids is None or topk_weights is None:
        raise RoutingError(f"{num_tokens} tokens but no routing")
    want = (num_tokens, top_k)
    if tuple(topk_ids.shape) != want or tuple(topk_weights.shape) != want:
        raise RoutingError(
            f"router gave ids {tuple(topk_ids.shape)} / weights {tuple(topk_weights.shape)}, the kernel takes "
            f"{want} (routed experts plus fused shared-expert columns)"
        )
    ids = topk_ids if topk_ids.dtype == torch.int32 else topk_ids.to(torch.int32)
    weights = topk_weights if topk_weights.dtype == torch.float32 else topk_weights.to(torch.float32)
    if check_ids:
        bad = (ids < -1) | (ids >= num_experts)
        if bool(bad.any()):
            raise RoutingError(f"expert ids outside [-1, {num_experts}): {ids[bad][:8].tolist()}")
    return KernelRouting(ids, weights, scale, top_k, num_tokens)


def glm_grouped_topk(
    router_logits: torch.Tensor,
    correction_bias: torch.Tensor,
    *,
    top_k: int,
    num_expert_group: int,
    topk_group: int,
    renormalize: bool,
    routed_scaling_factor: Optional[float] = None,
    apply_routed_scaling_factor_on_output: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GLM-4.x / DeepSeek-V3 routing: sigmoid scores, experts chosen on score + bias within the best
    `topk_group` groups (a group's score is the sum of its two best biased scores), weights are the unbiased
    scores, renormalised, optionally scaled. Returns (weights fp32, ids int32), like SGLang's select_experts
    (layers/moe/topk.py `biased_grouped_topk_impl`) with no fused shared experts."""
    scores = router_logits.float().sigmoid()
    num_tokens, num_experts = scores.shape
    choice = scores + correction_bias.float().view(1, num_experts)
    per_group = num_experts // num_expert_group  # explicit: a view with -1 is ambiguous for an empty batch
    group_scores = choice.view(num_tokens, num_expert_group, per_group).topk(2, dim=-1)[0].sum(dim=-1)
    group_idx = torch.topk(group_scores, k=topk_group, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
    score_mask = group_mask.unsqueeze(-1).expand(num_tokens, num_expert_group, per_group)
    masked = choice.masked_fill(~score_mask.reshape(num_tokens, num_experts).bool(), float("-inf"))
    ids = torch.topk(masked, k=top_k, dim=-1, sorted=False)[1]
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    if apply_routed_scaling_factor_on_output and routed_scaling_factor:
        weights = weights * routed_scaling_factor
    return weights.to(torch.float32), ids.to(torch.int32)
