"""A one-rank SGLang HiCache stack for a DSA-shaped model on a CPU, driven the way the scheduler drives it.

DEMO/TEST-ONLY (needs :mod:`.cpu_standins`). Everything here is SGLang 0.5.23's own code: ``DSATokenToKVPool`` (MLA
KV + DSA indexer), ``PagedTokenToKVPoolAllocator``, ``UnifiedRadixCache`` + ``init_hicache`` (the assembler builds
the ``HostPoolGroup`` {KV: MLATokenToKVPoolHost, INDEXER: DSAIndexerPoolHost} and a ``HybridCacheController``),
with the storage backend chosen by the published server args. This module only stands in for the scheduler loop
(insert, write-through, storage write-back, eviction, prefetch, load-back) and reads bytes back for checks.
"""

from __future__ import annotations

import atexit
import time
from array import array
from dataclasses import dataclass, field
from typing import Any

__all__ = ["StackSpec", "DsaStack", "publish_server_args", "CpGroupStandin", "layer_split_parallel"]


@dataclass(frozen=True)
class StackSpec:
    """Shape of the fake model. GLM-5: 78 layers, page 64, kv_cache_dim 656 (fp8 e4m3 packed), index_head_dim 128."""

    layers: int = 4
    page_size: int = 64
    device_pages: int = 16
    host_ratio: float = 2.0
    kv_lora_rank: int = 512
    qk_rope_head_dim: int = 64
    kv_cache_dim: int = 656
    index_head_dim: int = 128
    kv_dtype: str = "float8_e4m3fn"
    layout: str = "page_first_direct"
    io_backend: str = "direct"
    draft_layers: int = 0  # packed NextN draft layers (0.5.23 packs them into the KV and indexer pages)
    sidecar_draft: bool = False  # a one-layer DSA draft pool as SGLang's sidecar (DRAFT + DRAFT_INDEXER), registered
    # after the storage attach the way kv_cache_builder.maybe_register_hicache_draft does at startup
    tree_core_backend: str = "python"
    device: str = "cpu"  # "cuda" on a GPU node with SGLang: real kernels and pinned host pools, no stand-ins
    metrics: bool = False  # SGLang's --enable-metrics as the scheduler hands it on (CacheInitParams.enable_metrics)
    # --enable-dsa-cache-layer-split: the target pool is SGLang's LayerSplitDSATokenToKVPool for the published
    # attention-CP rank (publish ``layer_split_parallel``); the host pools are what its assembler makes of it
    layer_split: bool = False


def publish_server_args(spec: StackSpec, *, storage_backend: str | None, extra_config: str | None,
                        plugin_values: dict | None = None, parallel: dict | None = None):
    """Publish a dummy-model ServerArgs the way SGLang's own fixtures do; returns it (resolved).

    With ``plugin_values`` (e.g. ``{"enable_cp_l3": True, "cp_l3_config": path}``) the plugin flags ride on the
    record and the plugin's resolve-time hook turns them into ``dynamic`` + extra config, as in a server.
    ``parallel``: this process's published topology (e.g. one attention-CP rank: ``tp_rank``, ``tp_size``,
    ``attn_cp_size``, ...); default one rank.
    """
    from sglang.srt.runtime_context import get_parallel
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    server_args = ServerArgs(
        model_path="dummy",
        page_size=spec.page_size,
        enable_hierarchical_cache=True,
        hicache_io_backend=spec.io_backend,
        hicache_mem_layout=spec.layout,
        hicache_write_policy="write_through",
        hicache_storage_backend=storage_backend,
        hicache_storage_backend_extra_config=extra_config,
        hicache_storage_prefetch_policy="wait_complete",
        hicache_ratio=spec.host_ratio,
    )
    if plugin_values:
        # What the plugin's flag hooks do for a launch: the L3 flags checked by the feature's own validate, then
        # carried on the record (flags of other features keep their defaults).
        from ...declare import CARRIER_ATTR
        from ..feature import FEATURE

        values = {f.name: f.default for f in FEATURE.flags}
        values.update(plugin_values)
        FEATURE.validate(values)
        setattr(server_args, CARRIER_ATTR, values)
    set_global_server_args_for_scheduler(server_args)
    get_parallel().override_permanently(**{"tp_rank": 0, "tp_size": 1, "pp_rank": 0, "pp_size": 1,
                                           **(parallel or {})})
    return server_args


@dataclass(frozen=True)
class CpGroupStandin:
    """What SGLang's layer-split DSA pool and the L3 attach read of the published attention-CP ``GroupCoordinator``
    (``world_size``, ``rank_in_group``, ``ranks``, ``cpu_group``; ``pynccl_comm`` None: the pool then skips its NCCL
    broadcast communicator, ``dsa_cache_layer_split.py:256-259``). ``cpu_group``: the gloo group of a multi-process
    run, or None."""

    ranks: tuple
    rank_in_group: int
    cpu_group: Any = None
    pynccl_comm: Any = None
    device: str = "cpu"

    @property
    def world_size(self) -> int:
        return len(self.ranks)


def layer_split_parallel(rank: int, size: int, group: Any = None, ranks: tuple | None = None) -> dict:
    """The published topology of attention-CP rank ``rank`` of ``size`` (attention TP 1) with DSA cache layer split,
    for ``publish_server_args(parallel=...)`` / ``get_parallel().override(...)``."""
    group_ranks = tuple(range(size)) if ranks is None else tuple(ranks)
    return {"tp_rank": rank, "tp_size": size, "attn_cp_rank": rank, "attn_cp_size": size, "attn_tp_size": 1,
            "moe_tp_size": size, "attn_cp_group": CpGroupStandin(group_ranks, rank, group)}


def _dtype(name: str):
    import torch

    return getattr(torch, name)


@dataclass
class DsaStack:
    """One UnifiedRadixCache with HiCache over a DSA device pool. Build with :meth:`build`; close with :meth:`close`."""

    spec: StackSpec
    cache: Any
    allocator: Any
    kv_pool: Any
    server_args: Any
    draft_pools: tuple = ()
    sidecar_pools: tuple = ()  # device pools of sidecar drafts (their own host pools, their own payload kinds)
    sync_group: Any = None  # ranks of one group (CP): pump() then stops on the same iteration on every rank
    timeout: float = 20.0  # default bound of one pump(); multi-process runs on a loaded machine raise it
    _closed: bool = field(default=False, repr=False)

    @classmethod
    def build(cls, spec: StackSpec, server_args, groups: dict | None = None) -> "DsaStack":
        """``groups``: SGLang's cache process groups of a multi-rank run (``tp_cache_group``,
        ``attn_cp_cache_group``, ``attn_tp_cache_group``), as the scheduler passes them in CacheInitParams."""
        import torch
        from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool, ReqToTokenPool
        from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

        size = spec.device_pages * spec.page_size
        dtype = _dtype(spec.kv_dtype)

        def dsa_pool(layers):
            return DSATokenToKVPool(
                size=size, page_size=spec.page_size, kv_lora_rank=spec.kv_lora_rank, dtype=dtype,
                qk_rope_head_dim=spec.qk_rope_head_dim, layer_num=layers, device=spec.device,
                index_head_dim=spec.index_head_dim, enable_memory_saver=False, kv_cache_dim=spec.kv_cache_dim,
            )

        if spec.layer_split:
            from sglang.srt.mem_cache.dsa_cache_layer_split import LayerSplitDSATokenToKVPool
            from sglang.srt.runtime_context import get_parallel

            par = get_parallel()
            kv_pool = LayerSplitDSATokenToKVPool(
                size=size, page_size=spec.page_size, kv_lora_rank=spec.kv_lora_rank, dtype=dtype,
                qk_rope_head_dim=spec.qk_rope_head_dim, layer_num=spec.layers, device=spec.device,
                index_head_dim=spec.index_head_dim, enable_memory_saver=False, kv_cache_dim=spec.kv_cache_dim,
                layer_shard_rank=par.attn_cp_rank, layer_shard_size=par.attn_cp_size)
        else:
            kv_pool = dsa_pool(spec.layers)
        drafts = tuple(dsa_pool(1) for _ in range(spec.draft_layers))
        allocator = PagedTokenToKVPoolAllocator(size, spec.page_size, dtype, spec.device, kvcache=kv_pool,
                                                need_sort=False)
        req_pool = ReqToTokenPool(size=4, max_context_len=size + spec.page_size, device=spec.device,
                                  enable_memory_saver=False)
        params = CacheInitParams(
            disable=False, req_to_token_pool=req_pool, token_to_kv_pool_allocator=allocator,
            page_size=spec.page_size, tree_components=(ComponentType.FULL,),
            tree_core_backend=spec.tree_core_backend, mtp_draft_device_pools=drafts, enable_metrics=spec.metrics,
            **(groups or {}),
        )
        cache = UnifiedRadixCache(params)
        cache.init_hicache(server_args, params)
        atexit.unregister(cache.shutdown)  # as SGLang's own fixtures do: the test closes it explicitly
        cache.write_through_threshold = 1
        cache.load_back_threshold = 0
        cc = cache.cache_controller
        if cc is not None and cc.enable_storage:
            # Host and device pools are small here; let one request's prefetch use the whole host pool.
            cc.prefetch_capacity_limit = max(cc.prefetch_capacity_limit, cc.mem_pool_host.size)
        sidecars = ()
        if spec.sidecar_draft:
            from sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler import build_hicache_draft_sidecars

            sidecars = (dsa_pool(1),)
            specs, entries = build_hicache_draft_sidecars(draft_device_pools=sidecars, tree_cache=cache)
            for sidecar_spec, entry in zip(specs, entries, strict=True):
                cache.register_sidecar_pool(sidecar_spec, entry)  # -> backend.register_mem_host_pool_v2
        del torch
        sync = (groups or {}).get("tp_cache_group")
        return cls(spec, cache, allocator, kv_pool, server_args, drafts, sidecars, sync_group=sync)

    # ------------------------------------------------------------------ pools
    @property
    def controller(self):
        return self.cache.cache_controller

    @property
    def backend(self):
        return self.controller.storage_backend

    def host_pool(self, name: str = "kv"):
        from sglang.srt.mem_cache.hicache_storage import PoolName

        return self.controller.mem_pool_host.get_pool(PoolName(name))

    # ------------------------------------------------------------------ device bytes
    def fill_device(self, indices, seed: int) -> None:
        """Random bytes into every layer's KV and indexer rows at ``indices`` (token slots). Layers this rank does
        not hold (0-row buffers under layer split) are skipped."""
        import torch

        g = torch.Generator().manual_seed(seed)
        for pool in (self.kv_pool, *self.draft_pools, *self.sidecar_pools):
            for buf in pool.kv_buffer:
                if buf.shape[0] == 0:
                    continue
                rows = buf[indices]
                buf[indices] = torch.randint(0, 256, rows.shape, dtype=torch.uint8, generator=g).to(
                    buf.device).view(buf.dtype)
            pages = torch.unique(indices // self.spec.page_size)
            for buf in pool.index_k_with_scale_buffer:
                if buf.numel() == 0:
                    continue
                rows = buf[pages]
                buf[pages] = torch.randint(0, 256, rows.shape, dtype=torch.uint8, generator=g).to(
                    buf.device).view(buf.dtype)

    def snapshot_device(self, indices) -> list:
        """Copies of every layer's KV rows and indexer pages at ``indices``, for byte-exact comparisons."""
        import torch

        pages = torch.unique(indices // self.spec.page_size)
        out = []
        for pool in (self.kv_pool, *self.draft_pools, *self.sidecar_pools):
            out += [buf[indices].clone() for buf in pool.kv_buffer if buf.shape[0]]
            out += [buf[pages].clone() for buf in pool.index_k_with_scale_buffer if buf.numel()]
        return out

    # ------------------------------------------------------------------ scheduler stand-in
    def insert(self, tokens: list[int]):
        """Allocate device slots for ``tokens`` (page-aligned) and insert them; returns the slots."""
        from sglang.srt.mem_cache.base_prefix_cache import InsertParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        value = self.allocator.alloc(len(tokens))
        if value is None:
            raise RuntimeError("device pool full")
        self.cache.insert(InsertParams(key=RadixKey(array("q", tokens)), value=value))
        return value

    def match(self, tokens: list[int]):
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        return self.cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", tokens))))

    def pump(self, until, timeout: float | None = None, what: str = "condition") -> None:
        """Run the scheduler's per-tick HiCache work until ``until()``. With a ``sync_group`` every rank runs the
        same number of ticks (the MIN of ``until()`` over the group decides), as SGLang's collectives need."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            self.cache.check_hicache_events()
            done = bool(until())
            if self.sync_group is not None:
                import torch

                flag = torch.tensor([int(done)], dtype=torch.int)
                torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN, group=self.sync_group)
                done = bool(flag.item())
            if done:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"HiCache did not reach: {what}")
            time.sleep(0.001)

    def write_through(self, tokens: list[int]) -> None:
        """Wait until the inserted path is backed up in host memory (D2H committed)."""
        def backed():
            node = self.match(tokens).last_device_node
            return self.cache.is_backuped(node)

        self.pump(backed, what="host backup of the inserted path")

    def write_back_storage(self, tokens: list[int]) -> None:
        """Wait for the storage write-back SGLang starts by itself after each write-through ack
        (``_finish_write_through_ack`` -> ``write_backup_storage``), and for its acks."""
        self.write_through(tokens)
        self.pump(lambda: not self.cache.ongoing_write_through and not self.cache.ongoing_backup,
                  what="L3 write-back acks")

    def evict_device(self, num_tokens: int) -> None:
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        self.cache.evict(EvictParams(num_tokens=num_tokens))

    def evict_host(self, num_tokens: int) -> int:
        return self.cache.evict_host(num_tokens)

    def prefetch(self, tokens: list[int], rid: str, timeout: float | None = None) -> int:
        """Prefetch ``tokens`` from L3 after the host match, as the scheduler does; returns loaded tokens."""
        from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle

        m = self.match(tokens)
        host_len = m.host_hit_length + m.device_prefix_len
        handle = CacheRequestHandle(rid, 0)
        self.cache.prefetch_from_storage(handle, m.last_host_node, array("q", tokens[host_len:]), None, None)
        self.pump(lambda: self.cache.check_prefetch_progress(handle), timeout=timeout, what=f"prefetch {rid}")
        return self.cache.pop_prefetch_loaded_tokens(handle)

    def load_back(self, tokens: list[int]):
        """Load the host-resident prefix of ``tokens`` to the device; returns the device slots of the prefix."""
        m = self.match(tokens)
        node = m.last_host_node
        if m.host_hit_length:
            loaded = self.cache.load_back(node)
            if loaded is None:
                raise RuntimeError("load_back refused")
            self.cache.ready_to_load_host_cache()
            for ack in list(self.controller.ack_load_queue):
                ack.finish_event.synchronize()
            self.cache.loading_check()
        m = self.match(tokens)
        return self.cache.path_device_indices(m.last_device_node)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.cache.shutdown()
        finally:
            self.cache.release_host_resources()
