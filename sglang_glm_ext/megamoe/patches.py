"""megamoe's patches of SGLang (seed 1-30), all switched on by SGLang's `--moe-a2a-backend megamoe`.

`megamoe.*` (hooks.py): the GLM-4.x fast path, GLM-5.x's no-fallback guard, the launch and load checks,
one-line launch refusals; (weight_update.py) the SM90 layout kept right on weight updates and the FP4
updates refused.
`megamoe_fp4.*` (fp4_hooks.py): FP4 MegaMoE weights on the kept TRTLLM layout, FP4 scale groups.
Every hook returns to SGLang's own code unless the a2a backend is megamoe.
"""

from __future__ import annotations

from ..declare import Patch, Tier, patch_for
from .feature import FEATURE

patch = patch_for(FEATURE, tier=Tier.FEATURE, sglang_versions=("0.5.23",))

PATCHES: tuple[Patch, ...] = (
    patch(
        id="megamoe.glm4_shared_replicated",
        target="sglang.srt.models.glm4_moe.Glm4MoeSparseMoeBlock.__init__",
        hook_type="after",
        hook="sglang_glm_ext.megamoe.hooks:hook_glm4_init",
        reason="Under megamoe rebuild GLM-4's separate shared expert replicated (parallel_group='replicated'), as "
        "DeepSeek-V2 does (deepseek_v2.py:874-896): 0.5.23 leaves it TP-sharded (megamoe is missing from "
        "glm4_moe.py:481-490), and MegaMoE's per-rank rows carry no sum that would complete its shards.",
        seed_lines="10-19 (shared expert TP1)",
        remove_when="Glm4MoeSparseMoeBlock builds its shared expert replicated under megamoe.",
        signature=("self", "config", "layer_id", "quant_config", "prefix", "alt_stream"),
        source_sha="4ebd00f6e1632b23",
    ),
    patch(
        id="megamoe.glm4_forward",
        target="sglang.srt.models.glm4_moe.Glm4MoeSparseMoeBlock.forward",
        hook_type="around",
        hook="sglang_glm_ext.megamoe.hooks:hook_glm4_forward",
        reason="GLM-4.x MegaMoE fast path ahead of SGLang's DeepEP/normal selection (0.5.23 has none): gate, TopK "
        "(bypassed routing materialised), run_mega_routed_experts, + the replicated shared expert without an "
        "all-reduce. Under megamoe the stock paths are wrong for tp > 1 (scattered rows, no output sum) and, on "
        "SM90 FP8, run on interleaved w13; a batch the kernel cannot take raises on every rank instead.",
        seed_lines="10-19",
        remove_when="Glm4MoeSparseMoeBlock.forward has a MegaMoE branch and no silent stock fallback under megamoe.",
        signature=("self", "hidden_states", "forward_batch"),
        source_sha="979b93efa0ca3743",
    ),
    patch(
        id="megamoe.dsv2_no_fallback",
        target="sglang.srt.layers.moe.mega_moe.should_use_mega_moe",
        hook_type="around",
        hook="sglang_glm_ext.megamoe.hooks:hook_should_use_mega_moe",
        reason="GLM-5.x runs DeepseekV2MoE, whose miss path (forward_normal) under megamoe computes each token "
        "with only its rank's experts and adds the replicated shared expert on TP rank 0 only "
        "(adds_replicated_output_to_partial: megamoe is not 'complete'): for a GLM model's layer (marked at "
        "load) a 'no' raises on every rank instead of returning wrong tokens.",
        seed_lines="10-19 (no silent miss, GLM-5.x)",
        remove_when="SGLang's megamoe miss path gathers tokens (or refuses) instead of computing per-rank partials.",
        signature=("moe", "hidden_states"),
        source_sha="6d9a288654a3fdb7",
    ),
    patch(
        id="megamoe.dsv2_miss",
        target="sglang.srt.models.deepseek_v2.DeepseekV2MoE.forward",
        hook_type="around",
        hook="sglang_glm_ext.megamoe.miss_hooks:hook_dsv2_forward",
        reason="GLM-5.x's MoE block under megamoe: a batch the MegaMoE kernel cannot take (above the cap, or "
        "experts it cannot read here) runs the gathered miss path (rows and routing all-gathered over the EP "
        "group, this rank's experts through SGLang's own runner, partial sums reduce-scattered back, the "
        "replicated shared expert added) instead of forward_normal, which is wrong there for ep > 1.",
        seed_lines="10-29 (the MegaMoE fallback)",
        remove_when="SGLang's megamoe miss path gathers tokens over the EP group itself.",
        signature=("self", "hidden_states", "forward_batch", "gemm_output_zero_allocator", "input_ids",
                   "input_ids_global", "skip_shared_experts", "return_moe_output", "leave_output_sum"),
        source_sha="f3a64ad5dbad841b",
    ),
    patch(
        id="megamoe.launch_check",
        target="sglang.srt.arg_groups.mega_moe_hook.validate_mega_moe_token_budget_for_model",
        hook_type="around",
        hook="sglang_glm_ext.megamoe.hooks:hook_token_budget",
        reason="SGLang's MegaMoE token-budget check covers only MEGA_MOE_NO_FALLBACK_ARCHS and NVFP4; GLM models "
        "get it too, plus the eager-decode bound it leaves out, and clear refusals of what would miss the kernel "
        "(no MegaMoE builder for the expert format on this SM: bf16, excluded layers, FP8 on SM100, NVFP4/MXFP4 "
        "on SM90; Glm4MoeLite; a deep_gemm without the kernel) and of the retired fork env switches.",
        seed_lines="10-19, 30",
        remove_when="SGLang validates the MegaMoE token budget and expert formats for every megamoe launch.",
        signature=("server_args",),
        source_sha="115d7163f1ec830c",
    ),
    patch(
        id="megamoe.load_check",
        target="sglang.srt.model_executor.model_runner.ModelRunner.load_model",
        hook_type="after",
        hook="sglang_glm_ext.megamoe.hooks:hook_load_check",
        reason="After weights are post-processed, every MoE layer of a GLM model under megamoe must have MegaMoE "
        "weights this GPU runs (is_mega_moe_experts_ready) and every GLM-4 block must plan; otherwise the launch "
        "stops naming the layers, before serving. Also marks GLM-5.x's DeepseekV2MoE layers for the miss guard.",
        seed_lines="10-19",
        remove_when="SGLang refuses megamoe when a MoE layer has no MegaMoE weights.",
        signature=("self",),
        source_sha="bf6781e45efd63b5",
    ),
    patch(
        id="megamoe.compat_message",
        target="sglang.srt.arg_groups.mega_moe_hook.check_mega_moe_compat",
        hook_type="around",
        hook="sglang_glm_ext.megamoe.hooks:hook_compat",
        reason="SGLang refuses --moe-a2a-backend megamoe on a machine without an SM90/SM100 GPU (or with TBO/SBO) "
        "with a bare ValueError deep in the resolution traceback; the plugin gives its one line naming the fix.",
        seed_lines="30",
        remove_when="SGLang's megamoe compatibility refusal is a one-line launch error.",
        signature=("server_args",),
        source_sha="70529a2fe6999eed",
    ),
    patch(
        id="megamoe.launch_exit",
        target="sglang.srt.server_args.ServerArgs.resolve_once",
        hook_type="around",
        hook="sglang_glm_ext.megamoe.hooks:hook_resolve_once",
        reason="Every MegaMoE launch check runs inside resolve_once; a command-line launch (launch_server, sglang "
        "serve: the record's _launch_command) it refuses exits with the refusal lines and no traceback, as the "
        "plugin's other launch refusals do. Python callers keep the MegaMoELaunchError (a ValueError).",
        seed_lines="10-19, 30",
        remove_when="SGLang reports resolution refusals to command-line users without a traceback.",
        signature=("self",),
        source_sha="a77b5bf3f0348924",
    ),
    patch(
        id="megamoe.weights_sm90_loader",
        target="sglang.srt.layers.moe.fused_moe_triton.layer.FusedMoE._weight_loader_impl",
        hook_type="around",
        hook="sglang_glm_ext.megamoe.weight_update:hook_weight_loader_impl",
        reason="A weight update writes gate/up rows in place through the fused-MoE loader (_load_w13), but SGLang's "
        "SM90 MegaMoE builder interleaved w13 at load and returns early on every later post-process "
        "(mega_moe_sm90.py:98-99; the restore hook is a no-op): the kernel would read plain rows as interleaved. The "
        "written expert is de-interleaved, written and re-interleaved in place, on every update path. A write into "
        "an FP4 MegaMoE layout raises instead (it cannot be kept right in place).",
        seed_lines="10-19",
        remove_when="SGLang restores the SM90 MegaMoE w13 interleave around weight loading "
        "(restore_weights_before_loading / re-build after load).",
        signature=("self", "param", "loaded_weight", "weight_name", "shard_id", "expert_id"),
        source_sha="fedef474ee3dfc10",
    ),
    patch(
        id="megamoe.weights_sm90_loader_fused",
        target="sglang.srt.layers.moe.fused_moe_triton.layer.FusedMoE.weight_loader_fused",
        hook_type="around",
        hook="sglang_glm_ext.megamoe.weight_update:hook_weight_loader_fused",
        reason="The same for checkpoints that carry every expert's gate_up in one tensor (shard w13, all experts).",
        seed_lines="10-19",
        remove_when="SGLang restores the SM90 MegaMoE w13 interleave around weight loading.",
        signature=("self", "param", "loaded_weight", "weight_name", "shard_id"),
        source_sha="efaaee6960f4adc6",
    ),
    patch(
        id="megamoe.weight_update_tensor",
        target="sglang.srt.model_executor.model_runner_components.weight_updater.WeightUpdater.update_weights_from_tensor",
        hook_type="around",
        hook="sglang_glm_ext.megamoe.weight_update:hook_update_from_tensor",
        reason="load_format='direct' copies tensors verbatim into parameters; into the SM90 MegaMoE w13 that is the "
        "caller's bytes in an unknown row order, so it is refused with (False, why) before writing (every other "
        "format goes through the loader hook). FP4 MegaMoE layers are refused on every update path by SGLang's "
        "own _derived_weight_cache_error marker, set at load.",
        seed_lines="10-19",
        remove_when="SGLang restores the SM90 MegaMoE w13 interleave around weight loading.",
        signature=("self", "named_tensors", "load_format"),
        source_sha="301123886073eac4",
    ),
    patch(
        id="megamoe_fp4.nvfp4_keep_trtllm",
        target="sglang.srt.layers.quantization.modelopt_quant.ModelOptNvFp4FusedMoEMethod.__init__",
        hook_type="after",
        hook="sglang_glm_ext.megamoe.fp4_hooks:hook_nvfp4_init",
        reason="Under megamoe 0.5.23 turns the TRTLLM weight layout off for ModelOpt NVFP4 experts, so no fallback "
        "layout can exist. When FlashInfer TRTLLM is the runner the layer would get (flashinfer_trtllm[_routed], or "
        "auto on SM100), turn it back on, so create_weights and the loader lay the experts out as a2a=none does.",
        seed_lines="20-29",
        remove_when="SGLang keeps the TRTLLM layout under megamoe (MiniMax-M3 NVFP4 already does, "
        "minimax_m3_nvfp4.py _alias_mega_moe_to_trtllm_weights).",
        signature=("self", "quant_config"),
        source_sha="d4e96f0544d20a43",
    ),
    patch(
        id="megamoe_fp4.nvfp4_create_weights",
        target="sglang.srt.layers.quantization.modelopt_quant.ModelOptNvFp4FusedMoEMethod.create_weights",
        hook_type="after",
        hook="sglang_glm_ext.megamoe.fp4_hooks:hook_nvfp4_create_weights",
        reason="Under megamoe, at model construction (before any weight is read): refuse a shape MegaMoE NVFP4 "
        "cannot run (H % 256, I % 256 after padding; GLM-4.5-Air's I=1408), naming it; record each checkpoint "
        "tensor's shape/dtype at the FP4 parameters' loaders and turn a scale shape error into a named one.",
        seed_lines="1-9",
        remove_when="SGLang validates FP4 scale groups against the checkpoint tensors itself.",
        signature=("self", "layer", "num_experts", "hidden_size", "intermediate_size_per_partition",
                   "params_dtype", "extra_weight_attrs"),
        source_sha="b9f7f98bdb0ee231",
    ),
    patch(
        id="megamoe_fp4.nvfp4_weights",
        target="sglang.srt.layers.quantization.modelopt_quant.ModelOptNvFp4FusedMoEMethod"
        ".process_weights_after_loading",
        hook_type="around",
        hook="sglang_glm_ext.megamoe.fp4_hooks:hook_nvfp4_process_weights",
        reason="Under megamoe 0.5.23 repacks NVFP4 experts in place for MegaMoE and frees the checkpoint layout. "
        "Instead: validate the K/16 e4m3 scale groups, compute MegaMoE's alphas from the checkpoint scales, run "
        "SGLang's own TRTLLM preparation (modelopt_quant's get_moe_a2a_backend reads 'none' for that one call: "
        "its only use there is the MegaMoE early return), then give MegaMoE int8/int32 views of the TRTLLM "
        "tensors with _mega_moe_trtllm_layout, so the kernel gets weight_layout='trtllm'. Zero weight copy.",
        seed_lines="1-9, 20-29",
        remove_when="SGLang builds ModelOpt NVFP4 MegaMoE weights on the TRTLLM layout itself.",
        signature=("self", "layer"),
        source_sha="0b14fe78412090fe",
    ),
    patch(
        id="megamoe_fp4.mxfp4_create_weights",
        target="sglang.srt.layers.quantization.mxfp4.Mxfp4MoEMethod.create_weights",
        hook_type="after",
        hook="sglang_glm_ext.megamoe.fp4_hooks:hook_mxfp4_create_weights",
        reason="Under megamoe: refuse a shape the MXFP4 MegaMoE kernels cannot run before loading, naming it; "
        "record checkpoint scale shapes/dtypes (the MXFP4 fused loader copies a smaller scale tensor into a slice "
        "of a 1.0-filled buffer without error).",
        seed_lines="1-9",
        remove_when="SGLang validates MXFP4 scale groups against the checkpoint tensors itself.",
        signature=("self", "layer", "num_experts", "hidden_size", "intermediate_size_per_partition",
                   "params_dtype", "with_bias", "extra_weight_attrs"),
        source_sha="fecf0a49fe1dd2a5",
    ),
    patch(
        id="megamoe_fp4.mxfp4_weights",
        target="sglang.srt.layers.quantization.mxfp4.Mxfp4MoEMethod.process_weights_after_loading",
        hook_type="before",
        hook="sglang_glm_ext.megamoe.fp4_hooks:hook_mxfp4_process_weights",
        reason="Under megamoe: check the K/32 ue8m0 scale groups the checkpoint delivered, and record that MXFP4 "
        "layers keep no fallback layout (deep_gemm's TRTLLM weight layout is NVFP4-only), logged at startup with "
        "what a second copy would cost.",
        seed_lines="1-9",
        remove_when="SGLang validates MXFP4 MegaMoE scales and reports the missing fallback itself.",
        signature=("self", "layer"),
        source_sha="aaff7f1f081ce39a",
    ),
    patch(
        id="megamoe_fp4.memory_summary",
        target="sglang.srt.model_loader.loader.DefaultModelLoader.postprocess_weights",
        hook_type="after",
        hook="sglang_glm_ext.megamoe.fp4_hooks:hook_postprocess_weights",
        reason="One startup line per GPU after all MoE layers are processed: FP4 MegaMoE layers on the TRTLLM "
        "layout, expert weight bytes copied (target 0), extra bytes (alphas), and layers without a fallback.",
        seed_lines="20-29",
        remove_when="SGLang logs MegaMoE weight memory itself.",
        signature=("model", "target_device"),
        source_sha="d659ace457d4b365",
    ),
)
