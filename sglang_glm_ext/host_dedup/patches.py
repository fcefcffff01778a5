"""host_dedup's patches of SGLang 0.5.23 (hooks.py): the patch points of docs_internal/host_dedup.md, wiring
SGLang's own allocator-only pools and layerwise broadcaster with the plugin's L3. Each is a no-op where the
process's plan is off (the default)."""

from __future__ import annotations

from ..declare import Patch, Tier, patch_for
from .feature import FEATURE

_REMOVE = "SGLang wires its MLA host-dedup context into HiCache with per-node sources (upstream PR 26691 reopened)."
patch = patch_for(FEATURE, tier=Tier.FEATURE, sglang_versions=("0.5.23",), seed_lines="-", remove_when=_REMOVE)
_HOST = "sglang_glm_ext.host_dedup.hooks:"

PATCHES: tuple[Patch, ...] = (
    patch(
        id="host_dedup.peer_kv_host_pool",
        target="sglang.srt.mem_cache.pool_host.mla.MLATokenToKVPoolHost.__init__",
        hook_type="around",
        hook=_HOST + "hook_mla_host_init",
        reason="Nothing in 0.5.23 builds its allocator-only MLA host pool (MLAHostAllocation, pool_host/mla.py ~80, "
        "~122). On a dedup peer (not the first replica of its node's group) the target KV host pool is built from "
        "that geometry: the same slots and allocator, kept in lockstep with the source, and no host buffer.",
        signature=("self", "buffer_info", "host_to_device_ratio", "host_size", "page_size", "layout", "pin_memory",
                   "device", "allocator_type", "override_kv_cache_dim", "draft_buffer_infos", "dcp_size",
                   "dcp_rank", "device_capacity_tokens", "start_layer", "end_layer", "target_layer_num",
                   "layer_shard_enabled", "pool_label", "host_token_capacity"),
        source_sha="fbfc5db6dcb323d3",
    ),
    patch(
        id="host_dedup.peer_indexer_host_pool",
        target="sglang.srt.mem_cache.pool_host.dsa.DSAIndexerPoolHost.__init__",
        hook_type="around",
        hook=_HOST + "hook_indexer_host_init",
        reason="DSAIndexerHostPoolBuilder.build never passes is_dummy (pool_host/dsa.py ~97-112, ~157): the DSA "
        "indexer host pool of an allocator-only anchor becomes allocator-only too.",
        signature=("self", "decl", "anchor_host", "packed_draft_device_pools", "pin_memory", "device",
                   "allocator_type", "is_dummy"),
        source_sha="fd17026872d4edbb",
    ),
    patch(
        id="host_dedup.broadcaster",
        target="sglang.srt.managers.cache_controller.HiCacheController.__init__",
        hook_type="after",
        hook=_HOST + "hook_controller_init",
        reason="maybe_create_mla_host_dedup_context is never called, and MLAHostDedupBroadcaster.build makes TP rank "
        "0 of the whole TP group the source over NCCL and calls torch.cuda.synchronize. Build SGLang's broadcaster "
        "over one group per node (every dedup group created on every rank in one order), NCCL on CUDA, gloo on a "
        "CPU, with the node's first replica as the source; refuse at startup a host pool that contradicts the role.",
        signature=("self", "token_to_kv_pool_allocator", "mem_pool_host", "page_size", "tp_group",
                   "load_cache_event", "attn_cp_group", "attn_tp_group", "pp_group", "write_policy", "io_backend",
                   "storage_backend", "prefetch_threshold", "model_name", "storage_backend_extra_config",
                   "enable_storage_metrics", "host_memory_mode"),
        source_sha="fcaefe28faae925d",
    ),
    patch(
        id="host_dedup.storage_writers",
        target="sglang.srt.managers.cache_controller.HiCacheController._generate_storage_config",
        hook_type="after",
        hook=_HOST + "hook_storage_config",
        reason="Under dedup only the source holds the bytes: it is the one storage writer of its node's group (also "
        "where its TP rank is not 0) and its peers none, over l3.cp_storage_writers' every-replica writers; the "
        "plugin's backend reads the role from its extra config (peers read and write nothing, the source owns "
        "every page). SGLang's own gate (storage_supports_host_dedup) admits only no backend or 'file'.",
        signature=("self", "model_name", "storage_backend_extra_config"),
        source_sha="0c07af4c9973c70a",
        after=("l3.cp_storage_writers",),
    ),
    patch(
        id="host_dedup.skip_peer_d2h",
        target="sglang.srt.mem_cache.l2_transfer.L2TransferEngine.submit_device_to_host",
        hook_type="around",
        hook=_HOST + "hook_d2h",
        reason="An allocator-only host pool asserts in backup_from_device_all_layer (pool_host/mla.py ~999, "
        "dsa.py ~508): a peer leaves it out of the write-through D2H and keeps the allocation and the ack.",
        signature=("self", "transfers"),
        source_sha="87721d75265d0101",
    ),
    patch(
        id="host_dedup.load_broadcast",
        target="sglang.srt.mem_cache.l2_transfer.L2TransferEngine.submit_host_to_device",
        hook_type="around",
        hook=_HOST + "hook_h2d",
        reason="Load-back under dedup: the source copies each layer host -> device, then SGLang's "
        "broadcast_loaded_layer sends it to the peers' own device slots (rank-local indices, logical page order) "
        "before on_layer_done; a peer skips its allocator-only pools (load_to_device_per_layer asserts on them).",
        signature=("self", "transfers", "transfer_layer_id_max", "start_event", "on_layer_done"),
        source_sha="876a0b5d6dc6ae33",
    ),
    patch(
        id="host_dedup.load_plan_digest",
        target="sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller.HybridCacheController.load",
        hook_type="around",
        hook=_HOST + "hook_load",
        reason="Ranks whose load plans differ would deadlock the broadcast or land another request's KV; as "
        "SGLang's Mooncake linker does, the node's group compares a digest of the plan (host slots in page order) "
        "before the load, and every rank refuses a load it disagrees on (a load-back miss, recomputed).",
        signature=("self", "host_indices", "priority", "node_id", "extra_pools", "device_indices", "anchor_indices"),
        source_sha="feec2adf0c8317d3",
    ),
    patch(
        id="host_dedup.host_budget",
        target="sglang.srt.mem_cache.pool_host.base.ranks_per_host",
        hook_type="around",
        hook=_HOST + "hook_ranks_per_host",
        reason="SGLang's host-memory guard (host_memory_budget_bytes, pool_host/base.py ~84-108) gives each rank "
        "(free RAM - 10 GiB) // ranks on the host, peers included, so a source could not pin the RAM its "
        "allocator-only peers leave free. While a deduplicated rank sizes and builds its pools (host_dedup.auto_size "
        "sets the scope) it counts the ranks that pin pools: one per dedup group.",
        signature=(),
        source_sha="559104b5cb63ef84",
    ),
    patch(
        id="host_dedup.auto_size",
        target="sglang.srt.mem_cache.hicache_auto_size.auto_size_hicache",
        hook_type="around",
        hook=_HOST + "hook_auto_size",
        reason="Every host pool is built inside this context (kv_cache_builder ~456), auto-sized or not: on a "
        "deduplicated rank the plugin's host_budget scope is entered with it, so the auto-size budget and each "
        "pool's guard count one pool holder per dedup group.",
        signature=("params", "draft_plan", "enabled"),
        source_sha="6c764e0008bb4f73",
    ),
)
