"""Startup refusals, pure: every way a GLM launch under megamoe could miss the kernel is named, with the fix."""

import pytest

from sglang_glm_ext.megamoe import guard
from sglang_glm_ext.megamoe.guard import ExpertQuant, LaunchFacts, check_launch, classify_experts

FP8 = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}
SM90_API = frozenset({"fp8_mega_moe", "mega_moe_pre_dispatch_sm90", "get_symm_buffer_for_mega_moe"})
SM100_API = frozenset({"fp8_fp4_mega_moe", "mega_moe_pre_dispatch", "get_symm_buffer_for_mega_moe"})


def facts(**kw):
    base = dict(arch="Glm4MoeForCausalLM", quantization=None, hf_quant_config=FP8, sm=90, num_hidden_layers=92,
                speculative=False, enable_w4a4_mxfp4_megamoe=False, cap=8192, deep_gemm_api=SM90_API)
    base.update(kw)
    return LaunchFacts(**base)


@pytest.mark.parametrize("quantization,cfg,kind", [
    (None, None, "bf16"),
    (None, {}, "bf16"),
    (None, FP8, "fp8_block128"),
    ("fp8", None, "fp8_other"),  # online FP8 of a bf16 checkpoint: per-tensor, no block scales
    (None, {"quant_method": "fp8", "weight_block_size": [1, 128]}, "fp8_other"),
    ("modelopt_fp4", {"quant_method": "modelopt", "quant_algo": "NVFP4"}, "nvfp4"),
    (None, {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4"}}, "nvfp4"),
    (None, {"quant_method": "modelopt", "quant_algo": "FP8"}, "other"),
    ("mxfp4", None, "mxfp4"),
    (None, {"quant_method": "compressed-tensors"}, "other"),
    ("awq", None, "other"),
])
def test_classify_experts(quantization, cfg, kind):
    assert classify_experts(quantization, cfg).kind == kind


@pytest.mark.parametrize("kind,sm,ok", [
    ("fp8_block128", 90, True), ("fp8_block128", 100, False), ("nvfp4", 100, True), ("nvfp4", 103, True),
    ("nvfp4", 90, False), ("mxfp4", 100, True), ("mxfp4", 90, False), ("bf16", 90, False), ("bf16", 100, False),
    ("fp8_other", 90, False), ("other", 90, False), ("fp8_block128", 120, False),
])
def test_builder_table(kind, sm, ok):
    problem = guard.quant_problem(ExpertQuant(kind, kind), sm)
    assert (problem is None) is ok
    if not ok:
        assert "--moe-a2a-backend" in problem


def test_fp4_on_sm90_names_the_hardware_truth():
    problem = guard.quant_problem(ExpertQuant("nvfp4", "modelopt NVFP4"), 90)
    assert "SM100-only" in problem and "SM90" in problem
    assert "no CUDA GPU" in guard.quant_problem(ExpertQuant("fp8_block128"), None)


def test_a_valid_fp8_sm90_launch_passes():
    assert check_launch(facts()) == []
    assert check_launch(facts(arch="GlmMoeDsaForCausalLM")) == []
    assert check_launch(facts(quantization="modelopt_fp4", hf_quant_config={"quant_algo": "NVFP4"}, sm=100,
                              deep_gemm_api=SM100_API)) == []


@pytest.mark.parametrize("change,needle", [
    (dict(hf_quant_config={}), "bf16"),
    (dict(sm=100, deep_gemm_api=SM100_API), "SM90 only"),
    (dict(quantization="modelopt_fp4", hf_quant_config={"quant_algo": "NVFP4"}), "SM100-only"),
    (dict(quantization="mxfp4", hf_quant_config={}), "SM100-only"),
    (dict(enable_w4a4_mxfp4_megamoe=True), "--enable-w4a4-mxfp4-megamoe"),
    (dict(arch="Glm4MoeLiteForCausalLM"), "no MegaMoE path"),
    (dict(deep_gemm_api=frozenset(), deep_gemm_error="ImportError: x"), "deep_gemm does not import"),
    (dict(deep_gemm_api=SM100_API), "lacks ['fp8_mega_moe', 'mega_moe_pre_dispatch_sm90']"),
    (dict(sm=None), "no CUDA GPU"),
    (dict(retired_env={"SGLANG_OPT_USE_DEEPGEMM_MEGA_MOE": "1"}), "--moe-a2a-backend megamoe"),
    (dict(retired_env={"SGLANG_OPT_DEEPGEMM_MEGA_MOE_USE_FP4_ACTS": "1"}), "--enable-w4a4-mxfp4-megamoe"),
    (dict(decode=("a decode bound",)), "a decode bound"),
])
def test_each_refusal(change, needle):
    problems = check_launch(facts(**change))
    assert any(needle in p for p in problems), problems


def test_excluded_layers_refused_and_mtp_only_with_speculation():
    cfg = dict(FP8, ignored_layers=["model.layers.3.mlp.experts.0.gate_proj", "model.layers.92.mlp",
                                    "model.layers.5.self_attn.q_proj", "lm_head"])
    assert guard.excluded_moe_layers(cfg) == {3: ["model.layers.3.mlp.experts.0.gate_proj"],
                                              92: ["model.layers.92.mlp"]}
    problems = check_launch(facts(hf_quant_config=cfg))
    assert [p for p in problems if "excluded" in p] and not any("layer 92" in p for p in problems)
    problems = check_launch(facts(hf_quant_config=cfg, speculative=True))
    assert any("layer 92" in p for p in problems) and any("layer 3" in p for p in problems)
    nested = {"quantization": {"quant_algo": "NVFP4", "exclude_modules": ["model.layers.7.mlp.experts"]}}
    assert guard.excluded_moe_layers(nested) == {7: ["model.layers.7.mlp.experts"]}


def test_decode_bounds_sglang_leaves_out():
    common = dict(cap=64, attn_dp_size=1, tp_size=8, disaggregation_mode="null", enable_mixed_chunk=False,
                  chunked_prefill_size=64)
    assert guard.decode_problems(max_running_requests=64, tokens_per_request=1, **common) == []
    (p,) = guard.decode_problems(max_running_requests=65, tokens_per_request=1, **common)
    assert "65 requests x 1 tokens = 65" in p and "--max-running-requests to 64" in p
    (p,) = guard.decode_problems(max_running_requests=32, tokens_per_request=4, **common)
    assert "128 tokens" in p and "--max-running-requests to 16" in p
    (p,) = guard.decode_problems(max_running_requests=None, tokens_per_request=4, **common)
    assert "--max-running-requests is not set" in p and "at most 16" in p
    dp = dict(common, attn_dp_size=8)
    assert guard.decode_problems(max_running_requests=512, tokens_per_request=1, **dp) == []  # 64 per DP rank
    assert guard.decode_problems(max_running_requests=None, tokens_per_request=1,
                                 **dict(common, disaggregation_mode="prefill")) == []
    mixed = guard.decode_problems(max_running_requests=16, tokens_per_request=1,
                                  **dict(common, enable_mixed_chunk=True))
    assert len(mixed) == 1 and "--enable-mixed-chunk" in mixed[0]


def test_launch_message_lists_every_problem():
    msg = guard.launch_message("Glm4MoeForCausalLM", ["one", "two"])
    assert "Glm4MoeForCausalLM" in msg and "\n  - one\n  - two" in msg and "wrong tokens" in msg


def test_not_ready_reasons():
    assert "built no MegaMoE weights" in guard.not_ready_reason(built=False, sm=90, sm90_fp8_weights=False,
                                                                  has_sm90_api=True, quant_method="X")
    assert "SM90 block-FP8" in guard.not_ready_reason(built=True, sm=90, sm90_fp8_weights=False,
                                                       has_sm90_api=True, quant_method="X")
    assert "lacks fp8_mega_moe" in guard.not_ready_reason(built=True, sm=90, sm90_fp8_weights=True,
                                                           has_sm90_api=False, quant_method="X")
