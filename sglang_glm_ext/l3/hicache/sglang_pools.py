"""What the backend reads off SGLang at attach: its host pools' geometry, the pointers SGLang itself would copy,
the logical KV dtype, this process's place in the parallel layout, the host-memory mode. SGLang is imported inside
each function (it is only here at attach, never at import); ``plan.py`` turns what these return into decisions.
"""

from __future__ import annotations

import torch

from .cp_writers import Topology, TopologyError
from .extra_config import AttachError
from .parts import DCP_REFUSED, KV_SHARDING_REFUSED, LayerPart
from .pool_plans import Buffer, LayoutRefused, PoolGeometry, PoolPlan, plan_pool

__all__ = ["allocator_only", "pool_geometry", "check_against_sglang_pointers", "kv_dtype", "topology",
           "host_memory_mode", "pool_name", "layer_part"]


def pool_name(name) -> str:
    """A pool's name as SGLang passes it (a ``PoolName`` member or its string value), as a string."""
    value = getattr(name, "value", name)
    return value if isinstance(value, str) else str(value)


def allocator_only(pool) -> bool:
    """SGLang's allocator-only host pool (``is_dummy``: slots and an allocator, no buffer), as a host-dedup peer
    runs its MLA KV and DSA indexer pools."""
    return bool(getattr(pool, "_is_dummy", False))


def pool_geometry(name: str, pool) -> PoolGeometry:
    """Read one SGLang host pool's geometry. Raises LayoutRefused for pools the backend does not serve."""
    from sglang.srt.mem_cache.pool_host.dsa import DSAIndexerPoolHost
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

    cls = type(pool)
    where = f"host pool {name!r} ({cls.__module__}.{cls.__name__})"
    if cls.__name__ == "PageInterleaveHostPool":
        # Its host indices are logical (widened) slots: read as physical they name another page or none at all.
        raise LayoutRefused(f"{where}: the KV-sharded (page-interleave) host pool is not served: "
                            f"{KV_SHARDING_REFUSED}")
    if cls not in (MLATokenToKVPoolHost, DSAIndexerPoolHost, MHATokenToKVPoolHost):
        raise LayoutRefused(
            f"{where} is not served by L3: it serves MLA/DSA (GLM-5) and MHA (GLM-4.x) KV and the DSA indexer; "
            "Mamba, SWA, DeepSeek-V4 compressed, HiSparse, FP4/MXFP8-scaled and page-envelope pools are refused")
    if getattr(pool, "dcp_size", 1) != 1:
        raise LayoutRefused(f"{where}: decode context parallelism (dcp_size={pool.dcp_size}) is not served: "
                            f"{DCP_REFUSED}")
    layout = pool.layout
    if cls is MLATokenToKVPoolHost:
        if getattr(pool, "_is_dummy", False) or pool.kv_buffer is None:
            raise LayoutRefused(f"{where}: allocator-only MLA host pool holds no bytes to store (a host-dedup peer "
                                "attaches without a plan: backend.L3HiCacheStorage._attach_peer)")
        if layout == "page_first_kv_split":
            plan_pool(PoolGeometry(name, "mla", layout, 1, 1, 1, 1, ()))  # raises the written decision
        buf = pool.kv_buffer
        return PoolGeometry(name, "mla", layout, pool.page_size, pool.page_num, pool.layer_num,
                            pool.kv_cache_dim * pool.dtype.itemsize, (Buffer(buf.data_ptr(), buf.nbytes),),
                            draft_layers=pool.layer_num - pool.target_layer_num)
    if cls is DSAIndexerPoolHost:
        buf = pool.index_k_with_scale_buffer
        if buf is None:
            raise LayoutRefused(f"{where}: allocator-only indexer pool holds no bytes to store")
        return PoolGeometry(name, "dsa_indexer", layout, pool.page_size, pool.indexer_page_num, pool.layer_num,
                            pool.indexer_page_stride_size * pool.indexer_dtype.itemsize,
                            (Buffer(buf.data_ptr(), buf.nbytes),),
                            draft_layers=pool.layer_num - pool.target_layer_num)
    # MHA: K and V of (2, ...) kv_buffer, or one page_unified block per page
    item = pool.dtype.itemsize
    row, v_row = pool.head_num * pool.head_dim * item, pool.head_num * pool.v_head_dim * item
    draft = pool.layer_num - pool.target_layer_num
    if layout == "page_unified":
        buf = pool.kv_buffer
        return PoolGeometry(name, "mha", layout, pool.page_size, pool.page_num, pool.layer_num, row,
                            (Buffer(buf.data_ptr(), buf.nbytes),), draft_layers=draft, v_row_bytes=v_row,
                            unified_page_bytes=pool.page_unified_layout.bytes_per_page)
    k, v = pool.k_buffer, pool.v_buffer
    return PoolGeometry(name, "mha", layout, pool.page_size, pool.page_num, pool.layer_num, row,
                        (Buffer(k.data_ptr(), k.nbytes), Buffer(v.data_ptr(), v.nbytes)), draft_layers=draft,
                        v_row_bytes=v_row)


def check_against_sglang_pointers(plan: PoolPlan, pool, pages_in_use: int) -> str:
    """Compare the plan's page spans with SGLang's own ``get_page_buffer_meta`` for the first and last page.
    '' when they agree or SGLang offers no pointers for this layout; else the disagreement (attach refuses)."""
    meta = getattr(pool, "get_page_buffer_meta", None)
    if meta is None:
        return ""
    ps = plan.geometry.page_size
    for page in sorted({0, max(0, min(plan.num_pages, pages_in_use) - 1)}):
        idx = torch.arange(page * ps, (page + 1) * ps, dtype=torch.int64)
        try:
            ptrs, sizes = meta(idx)
        except (ValueError, NotImplementedError, AssertionError):
            return ""  # e.g. the DSA indexer in layer_first: SGLang has no zero-copy pointers, the plan stands alone
        theirs = sorted(zip((int(p) for p in ptrs), (int(s) for s in sizes)))
        ours = sorted(plan.spans(page))
        if theirs != ours:
            return (f"page {page}: SGLang's get_page_buffer_meta gives {theirs[:4]}..., the L3 plan {ours[:4]}...; "
                    "the host pool's geometry is not what the plugin understands (SGLang changed?)")
    return ""


def kv_dtype(storage_config, pools: dict) -> str:
    """The logical KV dtype: the plugin's storage-config hook writes it (SGLang's config has no such field);
    the DSA indexer pool's device pool knows it too."""
    got = (storage_config.extra_config or {}).get("kv_dtype")
    if got:
        return str(got)
    for pool in pools.values():
        dev = getattr(pool, "device_pool", None)
        if dev is not None and getattr(dev, "dtype", None) is not None:
            return str(dev.dtype).removeprefix("torch.")
    raise AttachError("the logical KV dtype is unknown (the plugin's l3.storage_kv_dtype patch did not run): "
                      "two deployments differing only in KV dtype would share pages, so L3 refuses to attach")


def topology(storage_config) -> Topology:
    """This process's place in SGLang's parallel layout: the published topology (global TP rank, CP, attention DP,
    nodes), else the storage config's view (unit tests, nothing published)."""
    try:
        from sglang.srt.runtime_context import get_parallel

        par = get_parallel()
        return Topology(tp_rank=int(par.tp_rank), tp_size=int(par.tp_size), pp_rank=int(par.pp_rank),
                        pp_size=int(par.pp_size), attn_cp_size=int(par.attn_cp_size),
                        attn_dp_size=int(getattr(par, "attn_dp_size", 1) or 1), nnodes=int(par.nnodes))
    except TopologyError:
        raise
    except Exception:  # noqa: BLE001 - unpublished topology: the storage config's view
        sc = storage_config
        return Topology(tp_rank=sc.tp_rank, tp_size=sc.tp_size, pp_rank=sc.pp_rank, pp_size=sc.pp_size,
                        attn_cp_size=sc.attn_cp_size)


def host_memory_mode() -> str:
    try:
        from sglang.srt.runtime_context import get_memory

        return get_memory().hicache_host_memory_mode
    except Exception:  # noqa: BLE001 - nothing published (unit tests): the default
        return "cache"


def layer_part(storage_config, pools: dict) -> LayerPart | None:
    """This rank's part under DSA cache layer split (None when the KV host pool is not layer-sharded), read from
    every place SGLang keeps it and refused (AttachError) unless they all agree: the MLA host pool
    (``_layer_shard_enabled``, ``_target_layer_indices``, ``_device_layer_num``), the indexer's device pool
    (``LayerSplitDSATokenToKVPool.layer_shard_rank/size``, its owned range), the published attention-CP group
    (``get_parallel``, what SGLang's pool builder split by, ``layers/cp/utils.py:61-73``) and the storage config
    (the controller's own attention-CP group, ``cache_controller.py:395-402``), against SGLang's own
    ``get_layer_shard_range``."""
    anchor = pools["kv"]
    split = bool(getattr(anchor, "_layer_shard_enabled", False))
    dev = getattr(pools.get("indexer"), "device_pool", None)
    if dev is not None and bool(getattr(dev, "layer_shard_enabled", False)) != split:
        raise AttachError(f"the KV host pool is{'' if split else ' not'} layer-sharded but the DSA indexer's device "
                          f"pool ({type(dev).__name__}) is{' not' if split else ''}: the pools disagree")
    if not split:
        return None
    from sglang.srt.layers.cp.utils import get_layer_shard_range
    from sglang.srt.runtime_context import get_parallel

    par = get_parallel()
    seen = {"the published attention-CP group": (int(par.attn_cp_rank), int(par.attn_cp_size)),
            "the storage config (the controller's attention-CP group)": (int(storage_config.attn_cp_rank),
                                                                         int(storage_config.attn_cp_size))}
    if dev is not None:
        seen["the DSA device pool"] = (int(dev.layer_shard_rank), int(dev.layer_shard_size))
    if len(set(seen.values())) != 1:
        raise AttachError("DSA cache layer split: this rank's (layer-shard rank, size) differs between "
                          + ", ".join(f"{k} {v}" for k, v in seen.items()))
    rank, size = next(iter(seen.values()))
    total = int(anchor._device_layer_num)
    start, end = get_layer_shard_range(rank, size, total)
    owned = tuple(int(i) for i in anchor._target_layer_indices)
    if owned != tuple(range(start, end)) or (dev is not None and tuple(dev._owned_local_layer_range()) != (start, end)):
        raise AttachError(f"DSA cache layer split: rank {rank} of {size} should own device layers [{start}, {end}) "
                          f"of {total} (SGLang's get_layer_shard_range), the KV host pool holds {owned}")
    group = getattr(par, "attn_cp_group", None)
    ranks = tuple(int(r) for r in (getattr(group, "ranks", None) or ()))
    if len(ranks) != size:
        raise AttachError(f"DSA cache layer split: the published attention-CP group names ranks {list(ranks)}, "
                          f"{size} expected (the ranks holding the other layers of each page)")
    first = int(anchor.start_layer)
    part = LayerPart(rank, size, first + start, first + end, total, ranks)
    if int(anchor.target_layer_num) != part.host_layers:
        raise AttachError(f"DSA cache layer split: the KV host pool has {anchor.target_layer_num} target layers per "
                          f"page, ceil({total} / {size}) = {part.host_layers} expected")
    return part
