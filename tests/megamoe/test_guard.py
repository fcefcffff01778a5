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


@pytest.mark.parametrize("kind,sm,builder,fallback", [
    ("fp8_block128", 90, True, "sm90_relayout"), ("fp8_block128", 100, False, "stock"),
    ("nvfp4", 100, True, "nvfp4_trtllm"), ("nvfp4", 103, True, "nvfp4_trtllm"), ("nvfp4", 90, False, None),
    ("mxfp4", 100, True, None), ("mxfp4", 90, False, None), ("bf16", 90, False, "stock"),
    ("bf16", 100, False, "stock"), ("fp8_other", 90, False, "stock"), ("other", 90, False, None),
    ("fp8_block128", 120, False, None),
])
def test_kernel_and_miss_path_table(kind, sm, builder, fallback):
    """The kernel reads (builder) or the miss path serves (fallback) each expert format, per SM; a launch is
    refused only where neither can."""
    quant = ExpertQuant(kind, kind)
    assert (guard.builder_for(quant, sm) is not None) is builder
    assert guard.fallback_for(quant, sm) == fallback
    problem = guard.quant_problem(quant, sm)
    assert (problem is None) is (builder or fallback is not None)
    if problem:
        assert "--moe-a2a-backend" in problem
    served = guard.served_by_miss_path(quant, sm)
    assert (served is not None) is (not builder and fallback is not None)


def test_nvfp4_without_the_kept_trtllm_layout_has_no_fallback():
    quant = ExpertQuant("nvfp4", "modelopt NVFP4")
    assert guard.fallback_for(quant, 100, keep_trtllm=False) is None
    assert guard.quant_problem(quant, 100, keep_trtllm=False) is None  # the kernel still reads it
    assert "Marlin" in guard.quant_problem(quant, 90)


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
    (dict(quantization="modelopt_fp4", hf_quant_config={"quant_algo": "NVFP4"}), "SM100-only"),
    (dict(quantization="mxfp4", hf_quant_config={}), "SM100-only"),
    (dict(enable_w4a4_mxfp4_megamoe=True), "--enable-w4a4-mxfp4-megamoe"),
    (dict(arch="Glm4MoeLiteForCausalLM"), "no MegaMoE path"),
    (dict(deep_gemm_api=frozenset(), deep_gemm_error="ImportError: x"), "deep_gemm does not import"),
    (dict(deep_gemm_api=SM100_API), "lacks ['fp8_mega_moe', 'mega_moe_pre_dispatch_sm90']"),
    (dict(sm=None), "no CUDA GPU"),
    (dict(retired_env={"SGLANG_OPT_USE_DEEPGEMM_MEGA_MOE": "1"}), "--moe-a2a-backend megamoe"),
    (dict(retired_env={"SGLANG_OPT_DEEPGEMM_MEGA_MOE_USE_FP4_ACTS": "1"}), "--enable-w4a4-mxfp4-megamoe"),
    (dict(budget=("a decode bound",)), "a decode bound"),
    (dict(ep_num_redundant_experts=8), "--ep-num-redundant-experts 0"),
])
def test_each_refusal(change, needle):
    problems = check_launch(facts(**change))
    assert any(needle in p for p in problems), problems


def test_layers_megamoe_cannot_read_are_served_and_said_at_startup():
    cfg = dict(FP8, ignored_layers=["model.layers.3.mlp.experts.0.gate_proj", "model.layers.92.mlp",
                                    "model.layers.5.self_attn.q_proj", "lm_head"])
    assert guard.excluded_moe_layers(cfg) == {3: ["model.layers.3.mlp.experts.0.gate_proj"],
                                              92: ["model.layers.92.mlp"]}
    assert check_launch(facts(hf_quant_config=cfg)) == []
    notes = guard.served_notes(facts(hf_quant_config=cfg))
    assert any("layer 3's experts are excluded" in n for n in notes) and not any("layer 92" in n for n in notes)
    notes = guard.served_notes(facts(hf_quant_config=cfg, speculative=True))
    assert any("layer 92" in n for n in notes)  # the MTP layer only with speculative decoding
    nested = {"quantization": {"quant_algo": "NVFP4", "exclude_modules": ["model.layers.7.mlp.experts"]}}
    assert guard.excluded_moe_layers(nested) == {7: ["model.layers.7.mlp.experts"]}
    assert check_launch(facts(hf_quant_config={})) == []  # bf16: every batch takes the miss path
    (note,) = guard.served_notes(facts(hf_quant_config={}))
    assert "every MoE layer takes the gathered miss path on every batch: bf16" in note
    assert check_launch(facts(sm=100, deep_gemm_api=frozenset())) == []  # FP8 on SM100: no kernel needed
    assert "block-FP8 experts on SM100" in guard.served_notes(facts(sm=100))[0]


def test_miss_path_availability_follows_the_expert_format():
    assert guard.miss_path_available(facts())
    assert guard.miss_path_available(facts(hf_quant_config={}))
    assert not guard.miss_path_available(facts(quantization="mxfp4", hf_quant_config={}, sm=100))
    assert not guard.miss_path_available(facts(arch="Glm4MoeLiteForCausalLM"))


def budget(**kw):
    base = dict(cap=64, chunked_prefill_size=64, chunk_asked=64, prefill_ceiling=64, tp_size=8, attn_tp_size=8,
                max_running_requests=64)
    base.update(kw)
    return guard.budget_problems(guard.BudgetFacts(**base))


def test_redundant_experts_refused_for_glm4_only():
    assert not check_launch(facts(arch="GlmMoeDsaForCausalLM", ep_num_redundant_experts=8))  # DeepseekV2MoE sizes them


def test_decode_bound_is_the_padded_eager_batch_times_the_widest_row_count():
    assert budget() == []
    (p,) = budget(max_running_requests=65)  # 65 requests, padded to 72 (a multiple of attention TP 8)
    assert "65 requests per rank" in p and "padded to 72" in p and "= 72 tokens" in p
    assert "--max-running-requests to 64" in p and "NUM_MAX_TOKENS_PER_RANK to 72" in p
    assert budget(max_running_requests=63, attn_tp_size=4, cap=63) != []  # 63 -> 64 eager rows > 63
    (p,) = budget(max_running_requests=32, speculative="EAGLE", num_draft_tokens=4, static_draft_tokens=4)
    assert "x 4 tokens (--speculative-num-draft-tokens 4) = 128 tokens" in p and "to 16" in p
    (p,) = budget(max_running_requests=16, speculative="EAGLE", num_draft_tokens=8, static_draft_tokens=4)
    assert "adaptive speculative decoding can grow to 8 draft tokens" in p and "= 128 tokens" in p
    (p,) = budget(max_running_requests=16, speculative="EAGLE", num_draft_tokens=2, static_draft_tokens=2,
                  eagle_topk=8)
    assert "--speculative-eagle-topk 8 rows per request" in p
    (p,) = budget(max_running_requests=None, speculative="EAGLE", num_draft_tokens=4, static_draft_tokens=4)
    assert "--max-running-requests is not set" in p and "at most 16" in p
    dp = dict(attn_dp_size=8, attn_tp_size=1, chunked_prefill_size=8, chunk_asked=64, prefill_ceiling=8)
    assert budget(max_running_requests=512, **dp) == []  # 64 per DP rank
    assert budget(max_running_requests=None, disaggregation_mode="prefill") == []
    (p,) = budget(max_running_requests=1, speculative="EAGLE", num_draft_tokens=16, static_draft_tokens=16, cap=64)
    assert "no --max-running-requests fits" in p  # 8 rows (1 request padded to attention TP 8) x 16


def test_prefill_bound_is_the_dp_adjusted_chunk_counted_once():
    # --tp 8 --dp 8 --enable-dp-attention --chunked-prefill-size 16384: SGLang resolves 2048 per DP rank.
    dp = dict(cap=1024, tp_size=8, attn_tp_size=1, attn_dp_size=8, chunk_asked=16384, max_running_requests=256)
    (p,) = budget(chunked_prefill_size=2048, prefill_ceiling=2048, **dp)
    assert "2048 tokens per rank (--chunked-prefill-size 16384 over 8 DP ranks = 2048 per rank)" in p
    assert "lower --chunked-prefill-size to 8192" in p
    assert budget(chunked_prefill_size=1024, prefill_ceiling=1024, **dict(dp, chunk_asked=8192)) == []
    (p,) = budget(chunked_prefill_size=1001, prefill_ceiling=1001, cap=1001, chunk_asked=1001,
                  max_running_requests=8)
    assert "reach 1008 tokens" in p and "padded to a multiple of attention TP 8" in p  # the chunk itself fits
    eager, captured = budget(chunked_prefill_size=500, prefill_ceiling=500, cap=512, chunk_asked=500,
                             max_running_requests=8, prefill_graph_bs=(256, 1024))
    assert "padded to the prefill CUDA-graph size 1024" in eager
    assert "a prefill CUDA graph is captured at 1024 tokens" in captured and "--cuda-graph-max-bs-prefill" in captured
    (p,) = budget(chunked_prefill_size=64, prefill_ceiling=16384, dynamic_chunking=True, max_prefill_tokens=16384,
                  max_running_requests=8)
    assert "--enable-dynamic-chunking" in p and "16384 tokens" in p and "--max-prefill-tokens" in p
    (p,) = budget(chunked_prefill_size=-1, chunk_asked=-1)
    assert "chunked prefill is off" in p and "--chunked-prefill-size" in p
    assert budget(chunked_prefill_size=-1, disaggregation_mode="decode") == []
    assert budget(chunked_prefill_size=256, prefill_ceiling=256, enable_prefill_cp=True, attn_cp_size=4) == []


def test_launch_message_is_one_line_per_refusal_naming_the_fix():
    msg = guard.launch_message("Glm4MoeForCausalLM", ["one; set --x", "two; set --y"])
    assert msg.splitlines() == ["sglang-glm-ext megamoe: Glm4MoeForCausalLM: one; set --x",
                                "sglang-glm-ext megamoe: Glm4MoeForCausalLM: two; set --y"]
    retired = guard.retired_message({"SGLANG_OPT_USE_DEEPGEMM_MEGA_MOE": "1"})
    assert "wrong tokens" not in retired and "megamoe would" not in retired and "unset it" in retired
    assert len(retired.splitlines()) == 1


def test_not_ready_reasons():
    assert "built no MegaMoE weights" in guard.not_ready_reason(built=False, sm=90, sm90_fp8_weights=False,
                                                                  has_sm90_api=True, quant_method="X")
    assert "SM90 block-FP8" in guard.not_ready_reason(built=True, sm=90, sm90_fp8_weights=False,
                                                       has_sm90_api=True, quant_method="X")
    assert "lacks fp8_mega_moe" in guard.not_ready_reason(built=True, sm=90, sm90_fp8_weights=True,
                                                           has_sm90_api=False, quant_method="X")


def test_with_the_miss_path_eager_batches_above_the_cap_are_served_captured_ones_refused():
    base = dict(cap=64, chunked_prefill_size=4096, chunk_asked=4096, prefill_ceiling=4096, tp_size=8,
                attn_tp_size=8, max_running_requests=256)
    refused = guard.budget_check(guard.BudgetFacts(**base))
    assert len(refused.problems) == 2 and refused.served == []  # prefill and decode, no miss path
    served = guard.budget_check(guard.BudgetFacts(**base, miss_path=True))
    assert served.problems == [] and len(served.served) == 2
    graphs = guard.budget_check(guard.BudgetFacts(**base, miss_path=True, decode_graph_bs=(8, 16, 32, 64, 128)))
    (p,) = graphs.problems  # captured at min(128, 256 aligned) = 128 requests: the kernel, above the cap
    assert "a decode CUDA graph is captured at 128 requests" in p and "--cuda-graph-max-bs-decode to 64" in p
    assert guard.budget_check(guard.BudgetFacts(**base, miss_path=True, decode_graph_bs=(8, 16, 32, 64))).problems == []
    # unset --max-running-requests and chunked prefill off: unbounded eager batches, served by the miss path
    unbounded = dict(base, max_running_requests=None, chunked_prefill_size=-1)
    assert guard.budget_check(guard.BudgetFacts(**unbounded, miss_path=True)).problems == []
    assert len(guard.budget_check(guard.BudgetFacts(**unbounded)).problems) == 2
