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
    # --- l3 backend (issue 10; owner: sglang_glm_ext/l3/hicache) ---
    Patch(
        id="l3.translate_flags",
        target="sglang.srt.server_args.ServerArgs.resolve_once",
        hook_type="before",
        hook="sglang_glm_ext.l3.hicache.hooks:hook_resolve_once",
        feature="l3",
        tier=Tier.FEATURE,
        reason="Turn --enable-cp-l3 --cp-l3-config into hicache_storage_backend='dynamic' plus the plugin's extra "
        "config on the record before SGLang resolves it, so SGLang's own checks (e.g. storage vs KV sharding) "
        "run on the result; refuse in plugin words before serving (no HiCache, an explicit storage backend, KV "
        "sharding, buffer_only, bad/unwritable config, require_plp on an unsafe disk). Every launch path "
        "(launch_server, serve, --config YAML, Engine) reaches resolve_once; a named backend cannot be "
        "registered in 0.5.23 (backend_factory.py ends in 'Unknown built-in backend').",
        seed_lines="458-486 (--enable-cp-l3, --cp-l3-config)",
        sglang_versions=V0523,
        remove_when="SGLang accepts plugin-registered storage backend names and plugin server-arg fields.",
        signature=("self",),
        source_sha="a77b5bf3f0348924",
    ),
    Patch(
        id="l3.storage_kv_dtype",
        target="sglang.srt.managers.cache_controller.HiCacheController._generate_storage_config",
        hook_type="after",
        hook="sglang_glm_ext.l3.hicache.hooks:hook_storage_config",
        feature="l3",
        tier=Tier.FEATURE,
        reason="HiCacheStorageConfig has no KV dtype (0.5.23 TODO in hicache_storage.py, SGLang issue #33268); "
        "for the plugin's backend only, add the device pool's logical dtype to its extra config, so e4m3 and "
        "e5m2 KV (both uint8 on the host) never share L3 pages.",
        seed_lines="476-521 (namespace: dtype is part of a page's identity)",
        sglang_versions=V0523,
        remove_when="HiCacheStorageConfig carries the KV dtype (SGLang issue #33268).",
        signature=("self", "model_name", "storage_backend_extra_config"),
        source_sha="0c07af4c9973c70a",
    ),
    # Demo/test-only (Tier.DEMO): never applied by register(); installed only by `sglang-glm-ext demo` and the
    # CPU tests through sglang_glm_ext.l3.hicache.testing.cpu_standins.install(), which refuses where a GPU is
    # visible or an SGLang server was launched in the process.
    Patch(
        id="l3_demo.cpu_kvcacheio",
        target="sglang.srt.mem_cache.pool_host.mla",
        hook_type="bind",
        hook="sglang_glm_ext.l3.hicache.testing.cpu_standins:install",
        feature="l3_demo",
        tier=Tier.DEMO,
        reason="On a CPU, 0.5.23's host pools leave the sgl_kernel kvcacheio ops unbound (imported only under "
        "_is_cuda/_is_hip/_is_xpu), so D2H/H2D raise NameError. Bind pure-torch/numpy copies with the same "
        "keyword signatures into pool_host.{mla,dsa,mha} for names that are unbound. Demo/test-only: they do "
        "not validate the CUDA kernels.",
        seed_lines="- (CPU demo and tests of 231-250, 426-457, 476-521)",
        sglang_versions=V0523,
        remove_when="SGLang ships CPU implementations of the kvcacheio ops.",
        signature=("transfer_kv_direct", "transfer_kv_per_layer_direct_pf_lf", "transfer_kv_all_layer_direct_lf_pf",
                   "transfer_kv_per_layer_mla", "transfer_kv_all_layer_mla", "transfer_kv_per_layer_mla_pf_lf",
                   "transfer_kv_all_layer_mla_lf_pf"),
    ),
    Patch(
        id="l3_demo.unpinned_mla_host_pool",
        target="sglang.srt.mem_cache.pool_host.mla.MLATokenToKVPoolHost.__init__",
        hook_type="around",
        hook="sglang_glm_ext.l3.hicache.testing.cpu_standins:install",
        feature="l3_demo",
        tier=Tier.DEMO,
        reason="pin_memory=True calls cudaHostRegister, which fails without a GPU; force pin_memory=False (as "
        "SGLang's own storage fixtures do for MHA). Demo/test-only.",
        seed_lines="-",
        sglang_versions=V0523,
        remove_when="SGLang skips pinning when no accelerator is present.",
        signature=("self", "buffer_info", "host_to_device_ratio", "host_size", "page_size", "layout", "pin_memory",
                   "device", "allocator_type", "override_kv_cache_dim", "draft_buffer_infos", "dcp_size",
                   "dcp_rank", "device_capacity_tokens", "start_layer", "end_layer", "target_layer_num",
                   "layer_shard_enabled", "pool_label", "host_token_capacity"),
        source_sha="fbfc5db6dcb323d3",
    ),
    Patch(
        id="l3_demo.unpinned_dsa_indexer_host_pool",
        target="sglang.srt.mem_cache.pool_host.dsa.DSAIndexerPoolHost.__init__",
        hook_type="around",
        hook="sglang_glm_ext.l3.hicache.testing.cpu_standins:install",
        feature="l3_demo",
        tier=Tier.DEMO,
        reason="As l3_demo.unpinned_mla_host_pool, for the DSA indexer host pool. Demo/test-only.",
        seed_lines="-",
        sglang_versions=V0523,
        remove_when="SGLang skips pinning when no accelerator is present.",
        signature=("self", "decl", "anchor_host", "packed_draft_device_pools", "pin_memory", "device",
                   "allocator_type", "is_dummy"),
        source_sha="fd17026872d4edbb",
    ),
    Patch(
        id="l3_demo.unpinned_mha_host_pool",
        target="sglang.srt.mem_cache.pool_host.mha.MHATokenToKVPoolHost.__init__",
        hook_type="around",
        hook="sglang_glm_ext.l3.hicache.testing.cpu_standins:install",
        feature="l3_demo",
        tier=Tier.DEMO,
        reason="As l3_demo.unpinned_mla_host_pool, for the MHA host pool. Demo/test-only.",
        seed_lines="-",
        sglang_versions=V0523,
        remove_when="SGLang skips pinning when no accelerator is present.",
        signature=("self", "buffer_info", "host_to_device_ratio", "host_size", "page_size", "layout", "pin_memory",
                   "device", "allocator_type", "device_capacity_tokens", "start_layer", "end_layer",
                   "draft_buffer_infos", "write_back_staging", "pool_label", "head_group_num", "host_token_capacity"),
        source_sha="95be47cf1857ceeb",
    ),
    # --- end l3 backend ---
)
