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
        hook="sglang_glm_ext.plugin.hooks:hook_add_cli_args",
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
        hook="sglang_glm_ext.plugin.hooks:hook_from_cli_args",
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
        hook="sglang_glm_ext.plugin.hooks:hook_engine_init",
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
    # --- cg_mem patches (seed 152-162; owner: sglang_glm_ext/cuda_graph_mem) ---
    Patch(
        id="cg_mem.capture",
        target="sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.capture",
        hook_type="around",
        hook="sglang_glm_ext.cuda_graph_mem.hooks:hook_capture",
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
        hook="sglang_glm_ext.cuda_graph_mem.hooks:hook_post_process_after_profile",
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
        hook="sglang_glm_ext.hostmem.hooks:check_cuda_host_register",
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
)
