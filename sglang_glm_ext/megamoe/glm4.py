"""A GLM-4.x MoE block's MegaMoE plan, and the exact arguments handed to the kernel runner. Pure; no SGLang import.

Plan once, run with no decisions left (FlashInfer's plan/run split): `plan_block` reads a
`Glm4MoeSparseMoeBlock` (duck-typed: config, experts, topk, shared_experts) once per layer and checks what the
MegaMoE kernel needs from it; `runner_kwargs` turns a plan and one batch's `KernelRouting` into the keyword
arguments of SGLang's model-agnostic `run_mega_routed_experts` (layers/moe/mega_moe.py:415-585), which sizes
DeepGEMM's symmetric buffer and calls its pre-dispatch and kernel. The shared expert is not in those
arguments: GLM-4's separate shared expert is replicated on every rank (hooks rebuild it, as DeepSeek-V2 does
under megamoe) and added to the kernel's fully combined rows by the hook, with no all-reduce.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from .routing import KernelRouting


class PlanError(ValueError):
    """The block cannot run the MegaMoE kernel as built; raised at load, before serving."""


@dataclass(frozen=True)
class BlockPlan:
    layer: str  # for messages: "model.layers.3.mlp (Glm4MoeSparseMoeBlock, layer 3)"
    layer_id: int
    hidden_size: int
    intermediate_size: int
    top_k: int  # the kernel's width: routed experts + fused shared-expert columns
    num_experts: int  # global experts the kernel routes over (routed + fused shared slots)
    routed_scaling_factor: float
    scale_fused_in_topk: bool
    activation_clamp: Optional[float]
    has_separate_shared: bool


def plan_block(block: Any, *, scale_fused_in_topk: bool, moe_ep_size: int, name: str = "") -> BlockPlan:
    """Read and check a GLM-4 block once. Raises PlanError naming the layer when it cannot take MegaMoE."""
    config, experts = block.config, block.experts
    layer_id = int(block.layer_id)
    label = f"{name or 'layer'} ({type(block).__name__}, layer {layer_id})"
    n_topk = int(config.num_experts_per_tok)
    fused = int(getattr(block, "num_fused_shared_experts", 0) or 0)
    if fused and moe_ep_size > 1:
        # SGLang's TopK remaps fused shared columns to per-rank slots under megamoe (topk.py
        # remap_topk_for_per_rank_shared_slots), but the GLM-4 block lays its experts out as routed + shared
        # without per-rank slots; SGLang disables the fusion for ep > 1 on CUDA (glm4_moe.py:1012-1031).
        raise PlanError(f"{label}: a fused shared expert with expert parallelism {moe_ep_size} has no MegaMoE "
                        "layout in the GLM-4 block; run with --disable-shared-experts-fusion")
    intermediate = int(config.moe_intermediate_size)
    per_partition = getattr(experts, "intermediate_size_per_partition", intermediate)
    if int(per_partition) != intermediate:
        raise PlanError(f"{label}: experts are split over MoE tensor parallelism ({per_partition} of {intermediate} "
                        "intermediate rows here); MegaMoE needs whole experts per rank (ep_size = tp_size)")
    shared = getattr(block, "shared_experts", None) if fused == 0 else None
    has_shared = shared is not None and getattr(config, "n_shared_experts", None)
    if has_shared and not getattr(shared, "is_replicated", False) and getattr(block, "tp_size", 1) > 1:
        raise PlanError(f"{label}: the shared expert is TP-sharded, but MegaMoE's output carries no cross-rank sum "
                        "to complete it; the plugin's init hook rebuilds it replicated (did it run?)")
    rsf = getattr(config, "routed_scaling_factor", None)
    runner_config = getattr(experts, "moe_runner_config", None)
    return BlockPlan(
        layer=label,
        layer_id=layer_id,
        hidden_size=int(config.hidden_size),
        intermediate_size=intermediate,
        top_k=n_topk + fused,
        num_experts=int(experts.num_experts),
        routed_scaling_factor=float(rsf) if rsf else 1.0,
        scale_fused_in_topk=bool(scale_fused_in_topk),
        activation_clamp=getattr(runner_config, "swiglu_limit", None),
        has_separate_shared=bool(has_shared),
    )


def runner_kwargs(plan: BlockPlan, routing: KernelRouting) -> dict[str, Any]:
    """Keyword arguments for `run_mega_routed_experts(experts, hidden_states, ids, weights, **kwargs)`.
    Invariant: top_k and num_tokens agree with the routing tensors, and the routed-scaling factor is applied
    exactly once (by the kernel's pre-dispatch unless the router already folded it in)."""
    if routing.top_k != plan.top_k:
        raise PlanError(f"{plan.layer}: routing has {routing.top_k} columns, the plan {plan.top_k}")
    return {
        "hidden_size": plan.hidden_size,
        "intermediate_size": plan.intermediate_size,
        "top_k": plan.top_k,
        "num_tokens": routing.num_tokens,
        "activation_clamp": plan.activation_clamp,
        "routed_scaling_factor": routing.routed_scaling_factor,
        "activation": "swiglu",
        # GLM-4's shared expert runs outside the kernel (DeepGEMM fuses one only for SM100 fp8xfp4).
        "num_shared_experts": 0,
        "shared_l1_weights": None,
        "shared_l2_weights": None,
        "routing_in_buffer": False,
    }
