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
    # --- megamoe fp4 patches (seed 1-9, 20-29; owner: sglang_glm_ext/megamoe/fp4_hooks.py) ---
    Patch(
        id="megamoe_fp4.nvfp4_keep_trtllm",
        target="sglang.srt.layers.quantization.modelopt_quant.ModelOptNvFp4FusedMoEMethod.__init__",
        hook_type="after",
        hook="sglang_glm_ext.megamoe.fp4_hooks:hook_nvfp4_init",
        feature="megamoe_fp4",
        tier=Tier.FEATURE,
        reason="Under megamoe 0.5.23 turns the TRTLLM weight layout off for ModelOpt NVFP4 experts, so no fallback "
        "layout can exist. When FlashInfer TRTLLM is the runner the layer would get (flashinfer_trtllm[_routed], or "
        "auto on SM100), turn it back on, so create_weights and the loader lay the experts out as a2a=none does.",
        seed_lines="20-29",
        sglang_versions=V0523,
        remove_when="SGLang keeps the TRTLLM layout under megamoe (MiniMax-M3 NVFP4 already does, "
        "minimax_m3_nvfp4.py _alias_mega_moe_to_trtllm_weights).",
        signature=("self", "quant_config"),
        source_sha="d4e96f0544d20a43",
    ),
    Patch(
        id="megamoe_fp4.nvfp4_create_weights",
        target="sglang.srt.layers.quantization.modelopt_quant.ModelOptNvFp4FusedMoEMethod.create_weights",
        hook_type="after",
        hook="sglang_glm_ext.megamoe.fp4_hooks:hook_nvfp4_create_weights",
        feature="megamoe_fp4",
        tier=Tier.FEATURE,
        reason="Under megamoe, at model construction (before any weight is read): refuse a shape MegaMoE NVFP4 "
        "cannot run (H % 256, I % 256 after padding; GLM-4.5-Air's I=1408), naming it; record each checkpoint "
        "tensor's shape/dtype at the FP4 parameters' loaders and turn a scale shape error into a named one.",
        seed_lines="1-9",
        sglang_versions=V0523,
        remove_when="SGLang validates FP4 scale groups against the checkpoint tensors itself.",
        signature=("self", "layer", "num_experts", "hidden_size", "intermediate_size_per_partition",
                   "params_dtype", "extra_weight_attrs"),
        source_sha="b9f7f98bdb0ee231",
    ),
    Patch(
        id="megamoe_fp4.nvfp4_weights",
        target="sglang.srt.layers.quantization.modelopt_quant.ModelOptNvFp4FusedMoEMethod"
        ".process_weights_after_loading",
        hook_type="around",
        hook="sglang_glm_ext.megamoe.fp4_hooks:hook_nvfp4_process_weights",
        feature="megamoe_fp4",
        tier=Tier.FEATURE,
        reason="Under megamoe 0.5.23 repacks NVFP4 experts in place for MegaMoE and frees the checkpoint layout. "
        "Instead: validate the K/16 e4m3 scale groups, compute MegaMoE's alphas from the checkpoint scales, run "
        "SGLang's own TRTLLM preparation (modelopt_quant's get_moe_a2a_backend reads 'none' for that one call: "
        "its only use there is the MegaMoE early return), then give MegaMoE int8/int32 views of the TRTLLM "
        "tensors with _mega_moe_trtllm_layout, so the kernel gets weight_layout='trtllm'. Zero weight copy.",
        seed_lines="1-9, 20-29",
        sglang_versions=V0523,
        remove_when="SGLang builds ModelOpt NVFP4 MegaMoE weights on the TRTLLM layout itself.",
        signature=("self", "layer"),
        source_sha="0b14fe78412090fe",
    ),
    Patch(
        id="megamoe_fp4.mxfp4_create_weights",
        target="sglang.srt.layers.quantization.mxfp4.Mxfp4MoEMethod.create_weights",
        hook_type="after",
        hook="sglang_glm_ext.megamoe.fp4_hooks:hook_mxfp4_create_weights",
        feature="megamoe_fp4",
        tier=Tier.FEATURE,
        reason="Under megamoe: refuse a shape the MXFP4 MegaMoE kernels cannot run before loading, naming it; "
        "record checkpoint scale shapes/dtypes (the MXFP4 fused loader copies a smaller scale tensor into a slice "
        "of a 1.0-filled buffer without error).",
        seed_lines="1-9",
        sglang_versions=V0523,
        remove_when="SGLang validates MXFP4 scale groups against the checkpoint tensors itself.",
        signature=("self", "layer", "num_experts", "hidden_size", "intermediate_size_per_partition",
                   "params_dtype", "with_bias", "extra_weight_attrs"),
        source_sha="fecf0a49fe1dd2a5",
    ),
    Patch(
        id="megamoe_fp4.mxfp4_weights",
        target="sglang.srt.layers.quantization.mxfp4.Mxfp4MoEMethod.process_weights_after_loading",
        hook_type="before",
        hook="sglang_glm_ext.megamoe.fp4_hooks:hook_mxfp4_process_weights",
        feature="megamoe_fp4",
        tier=Tier.FEATURE,
        reason="Under megamoe: check the K/32 ue8m0 scale groups the checkpoint delivered, and record that MXFP4 "
        "layers keep no fallback layout (deep_gemm's TRTLLM weight layout is NVFP4-only), logged at startup with "
        "what a second copy would cost.",
        seed_lines="1-9",
        sglang_versions=V0523,
        remove_when="SGLang validates MXFP4 MegaMoE scales and reports the missing fallback itself.",
        signature=("self", "layer"),
        source_sha="aaff7f1f081ce39a",
    ),
    Patch(
        id="megamoe_fp4.memory_summary",
        target="sglang.srt.model_loader.loader.DefaultModelLoader.postprocess_weights",
        hook_type="after",
        hook="sglang_glm_ext.megamoe.fp4_hooks:hook_postprocess_weights",
        feature="megamoe_fp4",
        tier=Tier.FEATURE,
        reason="One startup line per GPU after all MoE layers are processed: FP4 MegaMoE layers on the TRTLLM "
        "layout, expert weight bytes copied (target 0), extra bytes (alphas), and layers without a fallback.",
        seed_lines="20-29",
        sglang_versions=V0523,
        remove_when="SGLang logs MegaMoE weight memory itself.",
        signature=("model", "target_device"),
        source_sha="d659ace457d4b365",
    ),
    # --- end megamoe fp4 ---
)
