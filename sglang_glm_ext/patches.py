"""Every change sglang-glm-ext makes to SGLang, declared in one place.

docs_internal/patch_manifest.md is generated from this list (`sglang-glm-ext manifest --write`, checked by
tests/patching/test_manifest.py), and tests/test_contracts.py checks every target's signature and source
digest in the installed SGLang, so an SGLang upgrade fails fast and names what moved.
"""

from __future__ import annotations

from .patching.ledger import Patch, Tier

V0523 = ("0.5.23",)

PATCHES: tuple[Patch, ...] = (
    Patch(
        id="flags.cli_group",
        target="sglang.srt.server_args.ServerArgs.add_cli_args",
        hook_type="after",
        hook="sglang_glm_ext.flags:hook_add_cli_args",
        feature="flags",
        tier=Tier.GUARD,
        reason="Register the plugin's flags on SGLang's parser so launch_server/serve/--config accept them and "
        "--help lists them (ServerArgs is a sealed msgspec struct; no field can be added).",
        seed_lines="458-486 (--enable-cp-l3, --cp-l3-config), 152-162 (CG buffer logging switch)",
        sglang_versions=V0523,
        remove_when="SGLang offers a public API for plugin CLI arguments.",
        signature=("parser",),
        source_sha="8d5f9b207365f5ba",
    ),
    Patch(
        id="flags.from_cli",
        target="sglang.srt.server_args.ServerArgs.from_cli_args",
        hook_type="after",
        hook="sglang_glm_ext.flags:hook_from_cli_args",
        feature="flags",
        tier=Tier.GUARD,
        reason="Move the plugin flag values onto the ServerArgs record (bookkeeping attribute `_glm_ext`, "
        "pickled to scheduler subprocesses) and validate them before serving starts.",
        seed_lines="458-486",
        sglang_versions=V0523,
        remove_when="SGLang offers a public API for plugin CLI arguments.",
        signature=("cls", "args"),
        source_sha="32152825e268b6da",
    ),
    Patch(
        id="flags.engine_kwargs",
        target="sglang.srt.entrypoints.engine.Engine.__init__",
        hook_type="around",
        hook="sglang_glm_ext.flags:hook_engine_init",
        feature="flags",
        tier=Tier.GUARD,
        reason="Accept the plugin's options as Engine(...) keywords: take them out before msgspec rejects "
        "them, validate, and attach them to the ServerArgs the Engine builds.",
        seed_lines="458-486",
        sglang_versions=V0523,
        remove_when="SGLang offers a public API for plugin options on Engine.",
        signature=("self", "kwargs"),
        source_sha="54412adbf86ad86b",
    ),
    # --- cg_mem patches (seed 152-162; owner: sglang_glm_ext/cgmem) ---
    Patch(
        id="cg_mem.capture",
        target="sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.capture",
        hook_type="around",
        hook="sglang_glm_ext.cgmem.hooks:hook_capture",
        feature="cg_mem",
        tier=Tier.FEATURE,
        reason="Attribute decode CUDA-graph memory at capture (rank 0, when cg_mem is on): static buffer table "
        "with cross-family aliasing, graph-pool growth per shape, family TOTAL. capture() runs in every "
        "decode-graph runner's __init__ after share_buffers() and no EAGLE runner overrides it; their "
        "capture_one_shape overrides are covered by a per-capture instance attribute, not more patches.",
        seed_lines="152-162",
        sglang_versions=V0523,
        remove_when="SGLang logs per-runner static buffers and graph-pool growth per captured shape itself.",
        signature=("self",),
        source_sha="4e54deacc7c6003e",
    ),
    Patch(
        id="cg_mem.profile_pickle",
        target="sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner"
        "._post_process_after_profile",
        hook_type="around",
        hook="sglang_glm_ext.cgmem.hooks:hook_post_process_after_profile",
        feature="cg_mem",
        tier=Tier.FEATURE,
        reason="--enable-profile-cuda-graph: write cuda_graph_mem_<family>.pickle per runner; SGLang dumps every "
        "runner's snapshot to one fixed cuda_graph_runner_memory_usage.pickle, so each overwrites the last.",
        seed_lines="152-162",
        sglang_versions=V0523,
        remove_when="SGLang names the capture memory snapshot per runner.",
        signature=("self", "prof_context"),
        source_sha="2832e47a32038c28",
    ),
    # --- end cg_mem ---
    # --- host_register / regression-fix patches (seed 297-321 and any fix 0.5.23 lacks) ---
    Patch(
        id="host_register.ceiling",
        target="sglang.srt.mem_cache.pool_host.common._cuda_host_register",
        hook_type="before",
        hook="sglang_glm_ext.hostmem.hook:check_cuda_host_register",
        feature="host_register",
        tier=Tier.FEATURE,
        reason="SGLang 0.5.23 registers a layer-first host pool (no copy granularity) in one cudaHostRegister call; "
        "above ~1 TB that fails on B300, and it cannot be split safely without knowing the layer stride. Refuse "
        "at startup with the size, the ceiling and the fix (page_first layout or a smaller --hicache-size); also "
        "refuse an SGLANG_HICACHE_HOST_REGISTER_CHUNK_GB above the ceiling. Never changes what SGLang registers.",
        seed_lines="297-321",
        sglang_versions=V0523,
        remove_when="SGLang chunks layer-first host pools at layer boundaries (or caps every registration itself).",
        signature=("buffer", "registration_granularity_bytes"),
        source_sha="f13fb8ab7ebf962a",
    ),
    # --- end host_register ---
    # --- megamoe patches (seed 10-19, 30; owner: sglang_glm_ext/megamoe; on with --moe-a2a-backend megamoe) ---
    Patch(
        id="megamoe.glm4_shared_replicated",
        target="sglang.srt.models.glm4_moe.Glm4MoeSparseMoeBlock.__init__",
        hook_type="after",
        hook="sglang_glm_ext.megamoe.hooks:hook_glm4_init",
        feature="megamoe",
        tier=Tier.FEATURE,
        reason="Under megamoe rebuild GLM-4's separate shared expert replicated (parallel_group='replicated'), as "
        "DeepSeek-V2 does (deepseek_v2.py:874-896): 0.5.23 leaves it TP-sharded (megamoe is missing from "
        "glm4_moe.py:481-490), and MegaMoE's per-rank rows carry no sum that would complete its shards.",
        seed_lines="10-19 (shared expert TP1)",
        sglang_versions=V0523,
        remove_when="Glm4MoeSparseMoeBlock builds its shared expert replicated under megamoe.",
        signature=("self", "config", "layer_id", "quant_config", "prefix", "alt_stream"),
        source_sha="4ebd00f6e1632b23",
    ),
    Patch(
        id="megamoe.glm4_forward",
        target="sglang.srt.models.glm4_moe.Glm4MoeSparseMoeBlock.forward",
        hook_type="around",
        hook="sglang_glm_ext.megamoe.hooks:hook_glm4_forward",
        feature="megamoe",
        tier=Tier.FEATURE,
        reason="GLM-4.x MegaMoE fast path ahead of SGLang's DeepEP/normal selection (0.5.23 has none): gate, TopK "
        "(bypassed routing materialised), run_mega_routed_experts, + the replicated shared expert without an "
        "all-reduce. Under megamoe the stock paths are wrong for tp > 1 (scattered rows, no output sum) and, on "
        "SM90 FP8, run on interleaved w13; a batch the kernel cannot take raises on every rank instead.",
        seed_lines="10-19",
        sglang_versions=V0523,
        remove_when="Glm4MoeSparseMoeBlock.forward has a MegaMoE branch and no silent stock fallback under megamoe.",
        signature=("self", "hidden_states", "forward_batch"),
        source_sha="979b93efa0ca3743",
    ),
    Patch(
        id="megamoe.dsv2_no_fallback",
        target="sglang.srt.layers.moe.mega_moe.should_use_mega_moe",
        hook_type="around",
        hook="sglang_glm_ext.megamoe.hooks:hook_should_use_mega_moe",
        feature="megamoe",
        tier=Tier.FEATURE,
        reason="GLM-5.x runs DeepseekV2MoE, whose miss path (forward_normal) under megamoe computes each token "
        "with only its rank's experts and adds the replicated shared expert on TP rank 0 only "
        "(adds_replicated_output_to_partial: megamoe is not 'complete'): for a GLM model's layer (marked at "
        "load) a 'no' raises on every rank instead of returning wrong tokens.",
        seed_lines="10-19 (no silent miss, GLM-5.x)",
        sglang_versions=V0523,
        remove_when="SGLang's megamoe miss path gathers tokens (or refuses) instead of computing per-rank partials.",
        signature=("moe", "hidden_states"),
        source_sha="6d9a288654a3fdb7",
    ),
    Patch(
        id="megamoe.launch_check",
        target="sglang.srt.arg_groups.mega_moe_hook.validate_mega_moe_token_budget_for_model",
        hook_type="around",
        hook="sglang_glm_ext.megamoe.hooks:hook_token_budget",
        feature="megamoe",
        tier=Tier.FEATURE,
        reason="SGLang's MegaMoE token-budget check covers only MEGA_MOE_NO_FALLBACK_ARCHS and NVFP4; GLM models "
        "get it too, plus the eager-decode bound it leaves out, and clear refusals of what would miss the kernel "
        "(no MegaMoE builder for the expert format on this SM: bf16, excluded layers, FP8 on SM100, NVFP4/MXFP4 "
        "on SM90; Glm4MoeLite; a deep_gemm without the kernel) and of the retired fork env switches.",
        seed_lines="10-19, 30",
        sglang_versions=V0523,
        remove_when="SGLang validates the MegaMoE token budget and expert formats for every megamoe launch.",
        signature=("server_args",),
        source_sha="115d7163f1ec830c",
    ),
    Patch(
        id="megamoe.load_check",
        target="sglang.srt.model_executor.model_runner.ModelRunner.load_model",
        hook_type="after",
        hook="sglang_glm_ext.megamoe.hooks:hook_load_check",
        feature="megamoe",
        tier=Tier.FEATURE,
        reason="After weights are post-processed, every MoE layer of a GLM model under megamoe must have MegaMoE "
        "weights this GPU runs (is_mega_moe_experts_ready) and every GLM-4 block must plan; otherwise the launch "
        "stops naming the layers, before serving. Also marks GLM-5.x's DeepseekV2MoE layers for the miss guard.",
        seed_lines="10-19",
        sglang_versions=V0523,
        remove_when="SGLang refuses megamoe when a MoE layer has no MegaMoE weights.",
        signature=("self",),
        source_sha="bf6781e45efd63b5",
    ),
    # --- end megamoe ---
)
