"""GLM-5.x NVFP4 under megamoe (issue 22, defect 3): the forward through SGLang's real DeepseekV2MoE reaches the
MegaMoE kernel with the right routing, instead of raising at the first forward.

The defect, confirmed on 0.5.23: ModelOpt NVFP4's runner on `auto` resolves to FlashInfer TRTLLM on SM100
(layers/quantization/modelopt_quant.py:3117-3125), so DeepseekV2MoE binds its TopK to the BYPASSED format
(topk.py:793-804; GLM's grouped, biased, renormalised routing is bypassable), whose output has no topk_ids; the
MegaMoE path reads `topk_output.topk_ids` (layers/moe/mega_moe.py:376-383): AttributeError on warm-up.

Real: SGLang's DeepseekV2MoE (GLM-5's MoE block) with its gate, TopK, bf16 shared expert and a ModelOpt NVFP4
FusedMoE, the plugin's FP4 hooks (kept TRTLLM layout, through SGLang's own TRTLLM preparation), the plugin's
load check, SGLang's should_use_mega_moe / forward_mega_moe / _run_mega_routed / run_mega_routed_experts (NVFP4
branch). Fake: FlashInfer's TRTLLM permutations (fp4_harness.FakeFlashInfer), deep_gemm at the forward
(fake_deep_gemm: its FP4 kernel computes the MoE from the routing it is handed with the checkpoint's fp32 experts:
what is tested is the routing and the plumbing, not FP4 numerics, which need SM100), the platform's SM (100).
NVFP4 kernels are SM100-only: neither this machine nor the lent H200 runs them.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch

import fake_deep_gemm
import fp4_harness as H

HID, INTER, E = 256, 256, 8


@pytest.fixture(scope="module", autouse=True)
def plugin():
    import sglang_glm_ext

    sglang_glm_ext.register()


def glm5_config():
    from transformers import DeepseekV3Config

    return DeepseekV3Config(hidden_size=HID, intermediate_size=512, moe_intermediate_size=INTER, n_routed_experts=E,
                            n_shared_experts=1, num_experts_per_tok=2, n_group=4, topk_group=2,
                            routed_scaling_factor=2.5, norm_topk_prob=True, num_hidden_layers=4,
                            first_k_dense_replace=1, hidden_act="silu", topk_method="noaux_tc",
                            scoring_func="sigmoid")


def expert_math(ck):
    """fp32 experts of the checkpoint; fn(x, ids, weights, rank, local) as fake_deep_gemm's FP4 kernel takes it."""
    def fn(x, ids, weights, rank, local):
        out = torch.zeros(x.shape[0], HID)
        for t in range(x.shape[0]):
            for k in range(ids.shape[1]):
                e = int(ids[t, k])
                if rank * local <= e < (rank + 1) * local:
                    gate = ck.floats[(e, "w1")] @ x[t]
                    up = ck.floats[(e, "w3")] @ x[t]
                    out[t] += float(weights[t, k]) * (ck.floats[(e, "w2")] @ (torch.nn.functional.silu(gate) * up))
        return out
    return fn


def test_glm5_nvfp4_forward_reaches_the_kernel_with_standard_routing(monkeypatch):
    import sglang.srt.layers.moe.mega_moe as mm
    from sglang.srt.layers.moe.topk import TopKOutputFormat, select_experts
    from sglang.srt.layers.quantization.modelopt_quant import ModelOptFp4Config
    from sglang.srt.models.deepseek_v2 import DeepseekV2MoE
    from sglang.srt.runtime_context import get_parallel

    from sglang_glm_ext.megamoe import hooks

    ck = H.Checkpoint.random(E, HID, INTER, seed=3)
    fi = H.FakeFlashInfer()
    with torch.no_grad(), fi.installed(), H.sglang_runtime(quantization="modelopt_fp4", a2a="megamoe", runner="auto"):
        get_parallel().override_permanently(tp_size=1, tp_rank=0)
        qc = ModelOptFp4Config(is_checkpoint_nvfp4_serialized=True, group_size=16, packed_modules_mapping={},
                               exclude_modules=["model.layers.3.mlp.shared_experts", "model.layers.3.mlp.gate"])
        moe = DeepseekV2MoE(glm5_config(), layer_id=3, quant_config=qc, prefix="model.layers.3.mlp")
        assert moe.experts.runner_backend.is_flashinfer_trtllm()
        assert moe.topk.topk_config.output_format == TopKOutputFormat.BYPASSED  # what 0.5.23 binds
        H.load_nvfp4(moe.experts, ck)
        moe.experts.quant_method.process_weights_after_loading(moe.experts)  # the plugin keeps the TRTLLM layout
        assert moe.experts._mega_moe_weights_built and moe.experts._mega_moe_trtllm_layout
        g = torch.Generator().manual_seed(5)
        moe.gate.weight.copy_(torch.randn(E, HID, generator=g) * 0.1)
        moe.gate.e_score_correction_bias.copy_(torch.randn(E, generator=g) * 0.05)
        sh_gu = torch.randn(2 * INTER, HID, generator=g) * 0.05
        sh_down = torch.randn(HID, INTER, generator=g) * 0.05
        moe.shared_experts.gate_up_proj.weight.copy_(sh_gu)
        moe.shared_experts.down_proj.weight.copy_(sh_down)

        fake = fake_deep_gemm.install(monkeypatch)
        fake.fp4_experts = expert_math(ck)
        monkeypatch.setattr(mm, "_device_sm", 100)
        monkeypatch.setattr(mm, "_mega_moe_max_num_sms", lambda: None)
        monkeypatch.setattr(mm, "_MEGA_MOE_SYMM_BUFFER", {})
        monkeypatch.setenv("SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK", "64")
        get_parallel().override_permanently(moe_ep_group=SimpleNamespace(device_group=None),
                                            tp_group=SimpleNamespace(world_size=1))  # read by RowParallelLinear
        x = torch.randn(6, HID, generator=g)  # the layer was built in fp32 (the default dtype here)
        # TopK dispatches to its CUDA forward on a GPU (the only one that returns the BYPASSED form); on this CPU
        # its platform dispatch would pick forward_native, which ignores the format. Take the GPU's branch.
        moe.topk._forward_method = moe.topk.forward_cuda

        # 0.5.23 alone: the first forward dies in _run_mega_routed on the bypassed routing.
        with pytest.raises(AttributeError, match="topk_ids"):
            moe.forward(x)

        holder = torch.nn.Module()
        holder.layers = torch.nn.ModuleList([torch.nn.Module()])
        holder.layers[0].mlp = moe
        assert hooks.check_loaded_model(holder, "GlmMoeDsaForCausalLM") == []  # ready; TopK made standard
        assert moe.topk.topk_config.output_format == TopKOutputFormat.STANDARD
        y = moe.forward(x).float()

        (kernel,) = [c for n, c in fake.calls if n == "fp8_fp4_mega_moe"]
        assert kernel["recipe"] == (1, 1, 16) and kernel["weight_layout"] == "trtllm" and kernel["use_x_scales"]
        (pre,) = [c for n, c in fake.calls if n == "mega_moe_pre_dispatch"]
        assert pre["group_size"] == 16 and pre["mma_type"] == "nvfp4xnvfp4" and pre["x_scales"]
        logits = torch.nn.functional.linear(x.float(), moe.gate.weight.float())
        topk = select_experts(x, logits, moe.topk.topk_config, layer_id=3)
        assert torch.equal(pre["ids"].sort(-1).values, topk.topk_ids.to(torch.int32).sort(-1).values)
        rsf = 1.0 if moe.routed_scaling_factor_fused_in_topk else 2.5
        order = pre["ids"].argsort(-1)
        assert torch.allclose(pre["weights"].gather(1, order),
                              rsf * topk.topk_weights.float().gather(1, topk.topk_ids.argsort(-1)), rtol=1e-5)
        routed = expert_math(ck)(x.float(), topk.topk_ids, rsf * topk.topk_weights.float(), 0, E)
        gu = sh_gu @ x.float().t()
        shared = (sh_down @ (torch.nn.functional.silu(gu[:INTER]) * gu[INTER:])).t()
        ref = routed + shared
        assert float((y - ref).norm() / ref.norm()) < 2e-2  # bf16 output and bf16 shared expert
