"""L3's patches of SGLang: the flags become SGLang's own HiCache storage tier (hooks in l3/hooks.py), and the
demo/test-only CPU stand-ins (Tier.DEMO, demo/cpu_standins.py), which register() never applies."""

from __future__ import annotations

import functools

from ..declare import Patch, Tier, patch_for
from .feature import FEATURE

patch = patch_for(FEATURE, tier=Tier.FEATURE, sglang_versions=("0.5.23",))
demo_patch = functools.partial(patch, tier=Tier.DEMO, hook="sglang_glm_ext.l3.demo.cpu_standins:install")

PATCHES: tuple[Patch, ...] = (
    patch(
        id="l3.translate_flags",
        target="sglang.srt.server_args.ServerArgs.resolve_once",
        hook_type="before",
        hook="sglang_glm_ext.l3.hooks:hook_resolve_once",
        reason="Turn --enable-cp-l3 --cp-l3-config into hicache_storage_backend='dynamic' plus the plugin's extra "
        "config on the record before SGLang resolves it, so SGLang's own checks (e.g. storage vs KV sharding) "
        "run on the result; refuse in plugin words before serving (no HiCache, an explicit storage backend, KV "
        "sharding and decode CP with their reasons, buffer_only, bad/unwritable config, require_plp on an unsafe "
        "disk). Every launch path "
        "(launch_server, serve, --config YAML, Engine) reaches resolve_once; a named backend cannot be "
        "registered in 0.5.23 (backend_factory.py ends in 'Unknown built-in backend').",
        seed_lines="458-486 (--enable-cp-l3, --cp-l3-config)",
        remove_when="SGLang accepts plugin-registered storage backend names and plugin server-arg fields.",
        signature=("self",),
        source_sha="a77b5bf3f0348924",
    ),
    patch(
        id="l3.translate_flags_cli",
        target="sglang.srt.server_args.ServerArgs.from_cli_args",
        hook_type="after",
        hook="sglang_glm_ext.l3.hooks:hook_from_cli_args",
        reason="The same translation as l3.translate_flags for a command line (launch_server, serve, --config "
        "YAML), right after the plugin's flag hook attached the values (after=flags.from_cli): a CLI user gets a "
        "one-line 'sglang-glm-ext: ...' exit before anything starts, not a traceback from resolve_once. "
        "translate() runs once per record, so resolve_once then finds it done.",
        seed_lines="458-486 (--enable-cp-l3, --cp-l3-config)",
        remove_when="SGLang accepts plugin-registered storage backend names and plugin server-arg fields.",
        signature=("cls", "args"),
        source_sha="32152825e268b6da",
        after=("flags.from_cli",),  # it reads the values that hook attaches
    ),
    patch(
        id="l3.storage_kv_dtype",
        target="sglang.srt.managers.cache_controller.HiCacheController._generate_storage_config",
        hook_type="after",
        hook="sglang_glm_ext.l3.hooks:hook_storage_config",
        reason="HiCacheStorageConfig has no KV dtype (0.5.23 TODO in hicache_storage.py, SGLang issue #33268); "
        "for the plugin's backend only, add the device pool's logical dtype to its extra config, so e4m3 and "
        "e5m2 KV (both uint8 on the host) never share L3 pages. It also adds the ranks of the groups the "
        "controller's storage MINs reduce over (_create_sync_groups' sources), so under DSA cache layer split the "
        "backend attaches only where one of them holds every rank of its layer-shard group (no partial page).",
        seed_lines="476-521 (namespace: dtype is part of a page's identity)",
        remove_when="HiCacheStorageConfig carries the KV dtype (SGLang issue #33268).",
        signature=("self", "model_name", "storage_backend_extra_config"),
        source_sha="0c07af4c9973c70a",
    ),
    patch(
        id="l3.cp_storage_writers",
        target="sglang.srt.managers.cache_controller.HiCacheController._generate_storage_config",
        hook_type="after",
        hook="sglang_glm_ext.l3.hooks:hook_cp_writers",
        reason="Stock 0.5.23 lets one rank write replicated MLA/DSA pages (HiCacheStorageConfig.is_storage_writer: "
        "tp_rank == dcp_rank, read by HiCacheController.backup_skip and the hybrid controller's backup), so under "
        "attention CP one thread on one disk writes for the whole group and a second node's ranks write nothing. "
        "For the plugin's backend only, every replica becomes a writer to SGLang and the backend keeps one owner "
        "per page among its node's replicas (hicache/cp_writers.py), each writing its own mapped disk.",
        seed_lines="128-151, 181-222, 367-392, 426-457, 522-560 (CP owner lanes: each page written by one owner)",
        remove_when="SGLang lets a storage backend choose its writers (or spreads replicated writes itself).",
        signature=("self", "model_name", "storage_backend_extra_config"),
        source_sha="0c07af4c9973c70a",
    ),
    # Demo/test-only (Tier.DEMO): never applied by register(); installed only by `sglang-glm-ext demo` and the
    # CPU tests through sglang_glm_ext.l3.demo.cpu_standins.install(), which refuses where a GPU is
    # visible or an SGLang server was launched in the process (and the resolve hook above refuses a launch in a
    # process where they are installed).
    demo_patch(
        id="l3_demo.cpu_kvcacheio",
        target="sglang.srt.mem_cache.pool_host.mla",
        hook_type="bind",
        reason="On a CPU, 0.5.23's host pools leave the sgl_kernel kvcacheio ops unbound (imported only under "
        "_is_cuda/_is_hip/_is_xpu), so D2H/H2D raise NameError. Bind pure-torch/numpy copies with the same "
        "keyword signatures into pool_host.{mla,dsa,mha} for names that are unbound. Demo/test-only: they do "
        "not validate the CUDA kernels.",
        seed_lines="- (CPU demo and tests of 231-250, 426-457, 476-521)",
        remove_when="SGLang ships CPU implementations of the kvcacheio ops.",
        signature=("transfer_kv_direct", "transfer_kv_per_layer_direct_pf_lf", "transfer_kv_all_layer_direct_lf_pf",
                   "transfer_kv_per_layer_mla", "transfer_kv_all_layer_mla", "transfer_kv_per_layer_mla_pf_lf",
                   "transfer_kv_all_layer_mla_lf_pf"),
    ),
    demo_patch(
        id="l3_demo.unpinned_mla_host_pool",
        target="sglang.srt.mem_cache.pool_host.mla.MLATokenToKVPoolHost.__init__",
        hook_type="around",
        reason="pin_memory=True calls cudaHostRegister, which fails without a GPU; force pin_memory=False (as "
        "SGLang's own storage fixtures do for MHA). Demo/test-only.",
        seed_lines="-",
        remove_when="SGLang skips pinning when no accelerator is present.",
        signature=("self", "buffer_info", "host_to_device_ratio", "host_size", "page_size", "layout", "pin_memory",
                   "device", "allocator_type", "override_kv_cache_dim", "draft_buffer_infos", "dcp_size",
                   "dcp_rank", "device_capacity_tokens", "start_layer", "end_layer", "target_layer_num",
                   "layer_shard_enabled", "pool_label", "host_token_capacity"),
        source_sha="fbfc5db6dcb323d3",
    ),
    demo_patch(
        id="l3_demo.unpinned_dsa_indexer_host_pool",
        target="sglang.srt.mem_cache.pool_host.dsa.DSAIndexerPoolHost.__init__",
        hook_type="around",
        reason="As l3_demo.unpinned_mla_host_pool, for the DSA indexer host pool. Demo/test-only.",
        seed_lines="-",
        remove_when="SGLang skips pinning when no accelerator is present.",
        signature=("self", "decl", "anchor_host", "packed_draft_device_pools", "pin_memory", "device",
                   "allocator_type", "is_dummy"),
        source_sha="fd17026872d4edbb",
    ),
    demo_patch(
        id="l3_demo.unpinned_mha_host_pool",
        target="sglang.srt.mem_cache.pool_host.mha.MHATokenToKVPoolHost.__init__",
        hook_type="around",
        reason="As l3_demo.unpinned_mla_host_pool, for the MHA host pool. Demo/test-only.",
        seed_lines="-",
        remove_when="SGLang skips pinning when no accelerator is present.",
        signature=("self", "buffer_info", "host_to_device_ratio", "host_size", "page_size", "layout", "pin_memory",
                   "device", "allocator_type", "device_capacity_tokens", "start_layer", "end_layer",
                   "draft_buffer_infos", "write_back_staging", "pool_label", "head_group_num", "host_token_capacity"),
        source_sha="95be47cf1857ceeb",
    ),
)
