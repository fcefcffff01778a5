"""A CPU stand-in for SGLang's Triton fused-MoE kernel (`moe_runner/triton_utils/fused_moe.fused_experts`), the
kernel SGLang's FP8 runner calls on a GPU (quantization/fp8.py -> MoeRunner(TRITON) -> fused_experts_none_to_triton).
Only the kernel is replaced: SGLang's quant method, runner, dispatcher and combine run as they are. It computes
what the kernel computes for block-FP8 experts in the [gate; up] layout: per routed (token, local expert) pair,
down(silu(gate(x)) * up(x)) weighted by the top-k weight, ids of -1 (other ranks' experts, after the
dispatcher's local mapping) contributing nothing, times `moe_runner_config.routed_scaling_factor` as the CUDA
kernel applies it (its final moe_sum_reduce). It also records every call, so a test sees what the runner read.
"""

from __future__ import annotations

import torch

from sglang_glm_ext.megamoe import sm90_fp8

CALLS: list[dict] = []


def fused_experts(hidden_states, w1, w2, topk_output, moe_runner_config, b1=None, b2=None, use_fp8_w8a8=False,
                  use_int8_w8a8=False, use_int8_w8a16=False, use_int4_w4a16=False, per_channel_quant=False,
                  w1_scale=None, w2_scale=None, w1_zp=None, w2_zp=None, a1_scale=None, a2_scale=None,
                  block_shape=None, a1_q=None, fuse_swiglu_interleaved=False, **kwargs):
    topk_weights, topk_ids = topk_output.topk_weights, topk_output.topk_ids
    assert use_fp8_w8a8 and list(block_shape) == [128, 128], (use_fp8_w8a8, block_shape)
    CALLS.append({"rows": int(hidden_states.shape[0]), "w13": w1.view(torch.uint8).clone(), "ids": topk_ids.clone()})
    rsf = moe_runner_config.routed_scaling_factor or 1.0
    out = sm90_fp8.reference_moe(hidden_states.float(), topk_ids, topk_weights, w1, w1_scale, w2, w2_scale,
                                 routed_scaling_factor=rsf, w13_interleaved=False,
                                 activation_clamp=getattr(moe_runner_config, "swiglu_limit", None))
    return out.to(hidden_states.dtype)


def install(experts, monkeypatch=None):
    """Route `experts`' FP8 runner through SGLang's own standard->triton fused entry
    (`moe_runner.triton.fused_experts_none_to_triton`, what a2a none registers; under megamoe the runner takes its
    permute -> TritonRunnerCore path instead, the same Triton kernels, whose config and alignment steps need a
    GPU), and replace the Triton kernel call beneath it with the reference above."""
    import sglang.srt.layers.moe.moe_runner.triton as triton_runner
    import sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe as fm

    runner = experts.quant_method.runner
    assert runner.runner_backend.is_triton(), runner.runner_backend
    if monkeypatch is not None:
        monkeypatch.setattr(fm, "fused_experts", fused_experts)
        monkeypatch.setattr(runner, "fused_func", triton_runner.fused_experts_none_to_triton)
    else:
        fm.fused_experts = fused_experts
        runner.fused_func = triton_runner.fused_experts_none_to_triton
    CALLS.clear()
