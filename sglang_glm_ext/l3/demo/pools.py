"""SGLang's real host pools, built the way its assembler builds them, for backend-level tests. DEMO/TEST-ONLY.

No controller and no device copies: a test fills a host pool's bytes, drives the backend's v1/v2 calls with host
indices as SGLang would, and compares bytes. Needs :mod:`.cpu_standins` installed (unpinned host pools).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["HostPools", "build_host_pools", "storage_config"]


@dataclass
class HostPools:
    family: str
    layout: str
    page_size: int
    pools: dict           # PoolName value -> host pool
    device: Any           # the device pool the host pools mirror
    kv_dtype: str
    extras: dict = field(default_factory=dict)

    @property
    def kv(self):
        return self.pools["kv"]

    def page_tokens(self, pages) -> "Any":
        """Host token indices of whole host pages ``pages`` (a list of page numbers), as SGLang passes them."""
        import torch

        ps = self.page_size
        return torch.cat([torch.arange(p * ps, (p + 1) * ps, dtype=torch.int64) for p in pages])

    def fill_random(self, seed: int) -> None:
        import torch

        g = torch.Generator().manual_seed(seed)
        for buf in self.buffers():
            flat = buf.view(-1).view(torch.uint8)
            flat.copy_(torch.randint(0, 256, flat.shape, dtype=torch.uint8, generator=g))

    def zero(self) -> None:
        for buf in self.buffers():
            buf.zero_()

    def buffers(self) -> list:
        out = []
        for pool in self.pools.values():
            for name in ("kv_buffer", "index_k_with_scale_buffer"):
                buf = getattr(pool, name, None)
                if buf is not None:
                    out.append(buf)
        return out

    def page_bytes(self, name: str, page: int) -> bytes:
        """SGLang's own flat view of one host page (get_data_page), for comparisons."""
        pool = self.pools[name]
        return bytes(pool.get_data_page(page * self.page_size, flat=True).contiguous().view(-1)
                     .view(__import__("torch").uint8).numpy())


def build_host_pools(family: str, layout: str, *, layers: int = 3, page_size: int = 64, device_pages: int = 8,
                     kv_dtype: str = "float8_e4m3fn", draft_layers: int = 0, head_num: int = 2,
                     head_dim: int = 64, with_indexer: bool = True,
                     layer_split: "tuple[int, int] | None" = None) -> HostPools:
    """``family``: "dsa" (MLA KV + DSA indexer, GLM-5 shaped), "mla" (MLA KV only) or "mha" (GLM-4.x shaped).

    ``layer_split=(rank, size)`` ("dsa" only): SGLang's ``LayerSplitDSATokenToKVPool`` for that CP rank and its KV
    host pool built by SGLang's own ``build_kv_host_pool`` (``layer_shard_enabled``, ``ceil(L / size)`` host layers),
    which reads the layout from the published server args and the CP group from the published topology
    (``stack.publish_server_args`` with ``stack.layer_split_parallel``)."""
    import torch
    from sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler import _build_mha_mla_host_pool
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool, MHATokenToKVPool, MLATokenToKVPool
    from sglang.srt.mem_cache.pool_host.dsa import DSAIndexerPoolHost, make_dsa_indexer_pool_decl

    dtype = getattr(torch, kv_dtype)
    size = device_pages * page_size
    pools: dict = {}
    if family in ("dsa", "mla"):
        def device_pool(n):
            if family == "dsa":
                return DSATokenToKVPool(size=size, page_size=page_size, kv_lora_rank=512, dtype=dtype,
                                        qk_rope_head_dim=64, layer_num=n, device="cpu", index_head_dim=128,
                                        enable_memory_saver=False, kv_cache_dim=656)
            return MLATokenToKVPool(size, page_size, dtype, 512, 64, n, "cpu", False)

        drafts = tuple(device_pool(1) for _ in range(draft_layers))
        if layer_split is not None:
            if family != "dsa" or drafts:
                raise ValueError("layer_split: a DSA pool without packed draft layers")
            from sglang.srt.mem_cache.dsa_cache_layer_split import LayerSplitDSATokenToKVPool
            from sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler import build_kv_host_pool

            dev = LayerSplitDSATokenToKVPool(
                size=size, page_size=page_size, kv_lora_rank=512, dtype=dtype, qk_rope_head_dim=64,
                layer_num=layers, device="cpu", index_head_dim=128, enable_memory_saver=False, kv_cache_dim=656,
                layer_shard_rank=layer_split[0], layer_shard_size=layer_split[1])
            kv = build_kv_host_pool(kv_pool=dev, page_size=page_size)
            if kv.layout != layout:
                raise ValueError(f"layer_split: the published host layout is {kv.layout!r}, {layout!r} asked")
            pools["kv"] = kv
            pools["indexer"] = DSAIndexerPoolHost(decl=make_dsa_indexer_pool_decl(dev), anchor_host=kv)
            return HostPools(family, layout, page_size, pools, dev, kv_dtype)
        dev = device_pool(layers)
        kv = _build_mha_mla_host_pool(pool=dev, host_to_device_ratio=2.0, page_size=page_size, layout=layout,
                                      allocator_type="default", pool_label="kv")
        if drafts:
            from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

            info = dev.get_device_pool_infos()[0].buffer_info
            kv = MLATokenToKVPoolHost(
                info, 2.0, 0, page_size, layout, device_capacity_tokens=dev.size, start_layer=dev.start_layer,
                end_layer=dev.end_layer, target_layer_num=dev.layer_num, override_kv_cache_dim=dev.kv_cache_dim,
                draft_buffer_infos=tuple(d.get_device_pool_infos()[0].buffer_info for d in drafts))
        pools["kv"] = kv
        if family == "dsa" and with_indexer:
            pools["indexer"] = DSAIndexerPoolHost(decl=make_dsa_indexer_pool_decl(dev), anchor_host=kv,
                                                  packed_draft_device_pools=drafts)
    elif family == "mha":
        dev = MHATokenToKVPool(size, page_size, dtype, head_num, head_dim, layers, "cpu", False)
        pools["kv"] = _build_mha_mla_host_pool(pool=dev, host_to_device_ratio=2.0, page_size=page_size,
                                               layout=layout, allocator_type="default", pool_label="kv")
    else:
        raise ValueError(family)
    return HostPools(family, layout, page_size, pools, dev, kv_dtype)


def storage_config(config_path: str, *, kv_dtype: str | None = "float8_e4m3fn", is_mla: bool = True,
                   model_name: str = "glm-test", tp_rank: int = 0, tp_size: int = 1, attn_cp_size: int = 1,
                   attn_cp_rank: int = 0, user_extra: dict | None = None, writers_patch: bool = False,
                   dcp_size: int = 1):
    """The HiCacheStorageConfig SGLang's controller would build for the plugin's backend; ``writers_patch``: as the
    plugin's ``l3.cp_storage_writers`` hook returns it (every replica a writer). ``user_extra`` may carry what the
    ``l3.storage_kv_dtype`` hook adds (e.g. ``sync_group_ranks``)."""
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

    from ..hicache import extra_config

    extra = extra_config.build(config_path)
    extra.update(user_extra or {})
    if kv_dtype is not None:
        extra["kv_dtype"] = kv_dtype
    sc = HiCacheStorageConfig(tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=attn_cp_rank,
                              attn_cp_size=attn_cp_size, is_mla_model=is_mla, enable_storage_metrics=True,
                              is_page_first_layout=False, model_name=model_name, extra_config=extra,
                              dcp_size=dcp_size, dcp_rank=tp_rank % dcp_size,
                              logical_page_size=64 * dcp_size if dcp_size > 1 else None)
    if writers_patch:
        from ..hooks import hook_cp_writers

        sc = hook_cp_writers(sc, None)
    return sc
