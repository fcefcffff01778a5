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
from typing import TYPE_CHECKING, Any, Callable, Optional

if TYPE_CHECKING:  # routing imports torch; here it is an annotation only, so doctor and the CLI stay light
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


def routed_plus_shared(routed: Callable[[], Any], shared: Optional[Callable[[], Any]],
                       alt_stream: Optional[Any] = None) -> Any:
    """The block's output: the MegaMoE kernel's complete rows + the replicated shared expert on the same rows.

    With `alt_stream` (CUDA-graph capture, as SGLang's DeepSeek MegaMoE path does, layers/moe/mega_moe.py:217-245):
    the kernel runs on the alternate stream while the shared expert runs on the current one; the current stream
    waits for the kernel before the add. The same ops in the same order either way, so the result is bit-identical
    (scripts/gpu/megamoe_h200.py checks this and times both on an H200)."""
    if shared is None:
        return routed()
    if alt_stream is None:
        shared_out = shared()
        y = routed()
    else:
        import torch

        current = torch.cuda.current_stream()
        alt_stream.wait_stream(current)
        with torch.cuda.stream(alt_stream):
            y = routed()
        shared_out = shared()
        current.wait_stream(alt_stream)
    y.add_(shared_out)
    return y


# ---------------------------------------------------------------- what the replicated shared expert costs

# Public GLM-4.x shapes (config.json of the released checkpoints): hidden, moe_intermediate, shared experts,
# layers, dense layers first, quantisation of the shared expert.
KNOWN_GLM4 = {
    "GLM-4.5 / GLM-4.6 FP8": dict(hidden_size=5120, moe_intermediate_size=1536, n_shared_experts=1,
                                  num_hidden_layers=92, first_k_dense_replace=3,
                                  quantization_config={"quant_method": "fp8", "weight_block_size": [128, 128]}),
    "GLM-4.5-Air FP8": dict(hidden_size=4096, moe_intermediate_size=1408, n_shared_experts=1, num_hidden_layers=46,
                            first_k_dense_replace=1,
                            quantization_config={"quant_method": "fp8", "weight_block_size": [128, 128]}),
}


@dataclass(frozen=True)
class SharedExpertCost:
    """GPU memory of a GLM-4.x model's shared experts, per GPU. Under megamoe the plugin replicates them (full
    weights on every rank, so the kernel's complete rows need no all-reduce); TP sharding would hold 1/tp each."""

    moe_layers: int
    bytes_per_layer: int
    replicated_bytes: int  # per GPU, as the plugin builds it under megamoe
    tp_size: int
    tp_sharded_bytes: int  # per GPU, if sharded over tp_size ranks (what 0.5.23 builds, and cannot sum)
    weight_format: str

    @property
    def extra_bytes(self) -> int:
        return self.replicated_bytes - self.tp_sharded_bytes


def shared_expert_cost(config: Any, tp_size: int = 1) -> Optional[SharedExpertCost]:
    """From a GLM-4.x config (a mapping or an object with the HF fields). None when it has no separate shared
    expert. MoE layers are the layers after `first_k_dense_replace` (the MTP layer, built only for speculative
    decoding, adds one more)."""
    get = config.get if isinstance(config, dict) else (lambda k, d=None: getattr(config, k, d))
    n_shared = int(get("n_shared_experts", 0) or 0)
    if not n_shared:
        return None
    hidden, inter = int(get("hidden_size")), int(get("moe_intermediate_size")) * n_shared
    layers = int(get("num_hidden_layers")) - int(get("first_k_dense_replace", 0) or 0)
    params = 3 * hidden * inter  # gate_up [2I, H] + down [H, I]
    qc = get("quantization_config", None) or {}
    block = qc.get("weight_block_size") if isinstance(qc, dict) else None
    if isinstance(qc, dict) and qc.get("quant_method") == "fp8" and block:
        bn, bk = (int(b) for b in block)
        scales = (-(-2 * inter // bn) * -(-hidden // bk) + -(-hidden // bn) * -(-inter // bk)) * 4  # fp32
        per_layer, fmt = params + scales, f"FP8, {bn}x{bk} block scales"
    else:
        per_layer, fmt = 2 * params, "bf16"
    tp = max(int(tp_size or 1), 1)
    replicated = per_layer * layers
    return SharedExpertCost(layers, per_layer, replicated, tp, -(-replicated // tp), fmt)
