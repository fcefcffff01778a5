"""The SGLang side of the MegaMoE miss path (miss.py has the collectives): which layout each layer keeps for it, and
the local experts run through SGLang's own MoE runner for that layout.

A GLM MoE layer under megamoe misses the kernel when its batch is above the cap, or on every batch when MegaMoE
cannot read its experts on this GPU (bf16, FP8 on SM100, layers excluded from quantisation). The miss path then
gathers every rank's rows and routing over the EP group, runs this rank's experts on them the way SGLang's stock
path runs them (the layer's own `dispatcher.dispatch` -> `run_moe_core` -> `dispatcher.combine`, i.e.
`FusedMoE.forward_impl` without its all-reduce, then the model's own routed-scaling rule), reduce-scatters the
partial sums back to the rows' owners and adds the replicated shared expert. Which layout the runner reads
(`fallback_kind`, fixed at load, `FALLBACK_ATTR`):

- `sm90_relayout`: block-FP8 on SM90. SGLang's builder interleaved w13 in place for the kernel and kept no copy;
  its FP8 runner (Triton / DeepGEMM, still built under megamoe, quantization/fp8.py:2985-2994) reads [gate; up].
  For the miss the local experts' w13 is laid back to [gate; up] in place and interleaved again after (no memory
  kept; two passes over the layer's local w13 per miss, at HBM speed).
- `stock`: experts MegaMoE does not read keep their checkpoint layout; SGLang's runner for it as is.
- `nvfp4_trtllm`: ModelOpt NVFP4 kept on FlashInfer's TRTLLM layout (fp4_hooks: the kernel reads the same
  storage): the TRTLLM runner 0.5.23 leaves unbuilt under megamoe (modelopt_quant.py:3127-3130) is built at load
  with the a2a backend read as none, and `apply`'s megamoe refusal (:3189-3194) is lifted for the call. Zero extra
  memory.
- None: MXFP4 and 0.5.23's NVFP4 repack are MegaMoE-only layouts; such a layer cannot miss (refused at launch).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, Iterator, Optional

import torch

from . import miss, select, sm90_fp8
from .reads import FALLBACK_ATTR, GUARD_ATTR, _mod, block_plan, gate_inputs, megamoe_on

logger = logging.getLogger("sglang_glm_ext")


def fallback_kind(experts: Any, block: Any = None) -> Optional[str]:
    if block is not None and int(getattr(block, "num_fused_shared_experts", 0) or 0) > 0 \
            and int(getattr(experts, "moe_ep_size", 1) or 1) > 1:
        return None  # a fused shared expert in per-rank slots: no stock layout for it to gather over
    qm = getattr(experts, "quant_method", None)
    if sm90_fp8.layer_is_interleaved(experts):
        return "sm90_relayout" if getattr(qm, "runner", None) is not None else None
    if not getattr(experts, "_mega_moe_weights_built", False):
        return "stock"
    if getattr(experts, "_mega_moe_trtllm_layout", False):
        return "nvfp4_trtllm"
    return None


def prepare_fallback(experts: Any, block: Any = None) -> Optional[str]:
    """At load: record the layer's fallback layout; build the NVFP4 TRTLLM runner 0.5.23 skips under megamoe."""
    kind = fallback_kind(experts, block)
    if kind == "nvfp4_trtllm" and getattr(experts.quant_method, "runner", None) is None:
        from .fp4_hooks import _modelopt_sees_a2a_none

        # The runner a2a=none builds: create_moe_runner's megamoe early return and the runner's fused-op lookup
        # (keyed by the a2a backend: none -> fused_experts_none_to_flashinfer_trtllm_fp4) both read it as none.
        runner_mod = _mod("sglang.srt.layers.moe.moe_runner.runner")
        real = runner_mod.get_moe_a2a_backend
        runner_mod.get_moe_a2a_backend = lambda: _mod("sglang.srt.layers.moe.utils").MoeA2ABackend.NONE
        try:
            with _modelopt_sees_a2a_none():
                experts.quant_method.create_moe_runner(experts, experts.moe_runner_config)
        finally:
            runner_mod.get_moe_a2a_backend = real
        if getattr(experts.quant_method, "runner", None) is None:
            kind = None
    experts.__dict__[FALLBACK_ATTR] = kind
    return kind


@contextlib.contextmanager
def runner_layout(experts: Any, kind: Optional[str]) -> Iterator[None]:
    """The layout SGLang's runner reads, for one call; the kernel's layout again on every exit."""
    if kind == "sm90_relayout":
        w13 = experts.w13_weight.data
        every = range(w13.shape[0])  # expert by expert: one expert's scratch, not a second copy of the layer
        sm90_fp8.deinterleave_experts_(w13, every)
        try:
            yield
        finally:
            sm90_fp8.interleave_experts_(w13, every)
    elif kind == "nvfp4_trtllm":
        flag = experts._mega_moe_nvfp4
        experts._mega_moe_nvfp4 = False  # apply() refuses to run while set (modelopt_quant.py:3189-3194)
        try:
            yield
        finally:
            experts._mega_moe_nvfp4 = flag
    else:
        yield


def run_local_experts(experts: Any, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                      kind: Optional[str]) -> torch.Tensor:
    """This rank's experts on gathered rows with global ids, through SGLang's own pieces of FusedMoE.forward_impl
    (the dispatcher maps other ranks' experts to -1, token_dispatcher/standard.py:225-275), without its
    all-reduce: the partial sums go back to the owners by reduce-scatter instead."""
    topk_mod = _mod("sglang.srt.layers.moe.topk")
    topk = topk_mod.StandardTopKOutput(topk_weights=topk_weights, topk_ids=topk_ids, router_logits=None)
    dispatch = experts.dispatcher.dispatch(hidden_states=x, topk_output=topk)
    with runner_layout(experts, kind):
        combine_input = experts.run_moe_core(dispatch_output=dispatch)
    out = experts.dispatcher.combine(combine_input=combine_input)
    return out[..., : x.shape[-1]]


def _group() -> Any:
    par = _mod("sglang.srt.runtime_context").get_parallel()
    return par.moe_ep_group.device_group if int(par.moe_ep_size) > 1 else None


def _capture_sizes(group: Any, rows: int) -> Optional[list[int]]:
    """Under CUDA-graph capture every rank of the group captures the same padded size (DP attention pads to the
    bucket, attention TP splits evenly), and the count all-gather's host read cannot be captured: the sizes are
    known. None (all-gather them) otherwise."""
    if not bool(_mod("sglang.srt.layers.moe.mega_moe").get_is_capture_mode()):
        return None
    return [rows] * miss.group_size(group)


def _standard_routing(topk_output: Any, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    topk_mod = _mod("sglang.srt.layers.moe.topk")
    if topk_mod.TopKOutputChecker.format_is_bypassed(topk_output):
        topk_output = topk_output.to_standard(layer_id)
    return topk_output.topk_ids.to(torch.int32), topk_output.topk_weights.to(torch.float32)


def _empty_routing(hidden_states: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.empty((0, top_k), dtype=torch.int32, device=hidden_states.device),
            torch.empty((0, top_k), dtype=torch.float32, device=hidden_states.device))


# ---------------------------------------------------------------- GLM-4.x block

def forward_miss_glm4(block: Any, hidden_states: torch.Tensor, decision: select.Decision) -> torch.Tensor:
    plan = block_plan(block)
    n = int(hidden_states.shape[0])
    if n > 0:
        ids, weights = _standard_routing(block.topk(hidden_states, block.gate(hidden_states)), block.layer_id)
    else:
        ids, weights = _empty_routing(hidden_states, plan.top_k)
    gm = _mod("sglang.srt.models.glm4_moe")
    kind = block.experts.__dict__.get(FALLBACK_ATTR)

    def local(x, i, w):
        out = run_local_experts(block.experts, x, i, w, kind)
        if not gm._is_cuda and not gm._use_aiter:  # Glm4MoeSparseMoeBlock.forward_normal (glm4_moe.py:619-620)
            out = out * block.routed_scaling_factor
        return out

    shared = (lambda: block.shared_experts(hidden_states)) if plan.has_separate_shared and n > 0 else None
    group = _group()
    y = miss.gathered_moe(hidden_states, ids, weights, group=group, local_experts=local, shared=shared,
                          sizes=_capture_sizes(group, n))
    miss.COUNTERS.count("glm4", decision.reason, n)
    return y


# ---------------------------------------------------------------- GLM-5.x (DeepseekV2MoE)

def forward_miss_dsv2(moe: Any, hidden_states: torch.Tensor, forward_batch: Any, input_ids_global: Any,
                      decision: select.Decision) -> torch.Tensor:
    n = int(hidden_states.shape[0])
    top_k = int(moe.config.num_experts_per_tok) + int(moe.num_fused_shared_experts or 0)
    if n > 0:  # the routing of SGLang's MegaMoE path (mega_moe.py:361-379)
        mm = _mod("sglang.srt.layers.moe.mega_moe")
        router_logits = moe.gate(hidden_states, forward_batch=forward_batch)
        if not moe.is_hash and getattr(moe.gate, "e_score_correction_bias_vl", None) is not None:
            topk_output = mm.vision_topk(moe, router_logits, input_ids_global)
        else:
            kwargs = {"input_ids": input_ids_global} if moe.is_hash else {}
            topk_output = moe.topk(hidden_states, router_logits, **kwargs)
        ids, weights = _standard_routing(topk_output, moe.layer_id)
    else:
        ids, weights = _empty_routing(hidden_states, top_k)
    dv = _mod("sglang.srt.models.deepseek_v2")
    kind = moe.experts.__dict__.get(FALLBACK_ATTR)

    def local(x, i, w):
        out = run_local_experts(moe.experts, x, i, w, kind)
        # DeepseekV2MoE.forward_normal's routed scaling (deepseek_v2.py:1415-1427, 1442-1447), shared added later
        if (not dv._is_cuda and not dv._is_musa and not dv._is_xpu
                and not (dv._use_aiter and moe.routed_scaling_factor_fused_in_topk)) \
                or isinstance(moe.experts.quant_method, dv.KTEPWrapperMethod):
            out = out * moe.routed_scaling_factor
        return dv.maybe_fuse_routed_scale_and_shared_add(moe.experts, out, None, moe.routed_scaling_factor)

    def shared():
        return moe._forward_shared_experts(hidden_states)

    group = _group()
    y = miss.gathered_moe(hidden_states, ids, weights, group=group, local_experts=local,
                          shared=shared if moe.num_fused_shared_experts == 0 and moe.shared_experts is not None
                          else None, sizes=_capture_sizes(group, n))
    miss.COUNTERS.count("glm5", decision.reason, n)
    return y


def hook_dsv2_forward(original: Callable, self, hidden_states, forward_batch=None, *args, **kwargs):
    """AROUND DeepseekV2MoE.forward. For a GLM model's layer under megamoe (marked at load) a batch the kernel
    cannot take runs the gathered miss path; everything else is SGLang's own forward (its MegaMoE branch)."""
    if not getattr(self, GUARD_ATTR, False) or not megamoe_on():
        return original(self, hidden_states, forward_batch, *args, **kwargs)
    decision = select.decide(gate_inputs(self.experts, hidden_states))
    if decision.path is select.Path.MISS:
        return forward_miss_dsv2(self, hidden_states, forward_batch, kwargs.get("input_ids_global"), decision)
    return original(self, hidden_states, forward_batch, *args, **kwargs)
