"""The functions SGLang calls through host_dedup's patches (``patches.py``); SGLang is imported inside them.

Every hook first asks the process's plan (``plan.decide`` over what SGLang published); with dedup off each hands the
call on unchanged. SGLang's own primitives do the work: ``MLAHostAllocation`` / ``is_dummy`` (allocator-only pools),
``MLAHostDedupBroadcaster`` (layerwise broadcast, chunked by ``SGLANG_MLA_DEDUP_CHUNK_TOKENS``). Its ``build()`` is
not used: it forces NCCL over the whole TP group, makes TP rank 0 the source and calls ``torch.cuda.synchronize``;
here the group is per node (one source per node), NCCL on CUDA and gloo on a CPU (the CPU serving mode and the demo).
"""

from __future__ import annotations

import json
import logging
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from .feature import asked_mode
from .plan import PLUGIN_BACKEND, DedupPlan, Facts, decide, plan_digest

logger = logging.getLogger("sglang_glm_ext")

__all__ = ["current_plan", "DedupRun", "RUN_ATTR", "hook_mla_host_init", "hook_indexer_host_init",
           "hook_controller_init", "hook_storage_config", "hook_d2h", "hook_h2d", "hook_load", "hook_ranks_per_host",
           "hook_auto_size"]

RUN_ATTR = "_glm_ext_host_dedup"  # on the controller and its L2TransferEngine: this process's DedupRun
ROLE_KEY = "host_dedup"  # in the plugin backend's extra config: {"role", "source_tp_rank", "group"}


def _storage(sa) -> str:
    backend = getattr(sa, "hicache_storage_backend", None)
    if not backend:
        return ""
    if backend == "dynamic":
        extra = getattr(sa, "hicache_storage_backend_extra_config", None) or "{}"
        try:
            extra = json.loads(extra) if isinstance(extra, str) else dict(extra)
        except (ValueError, TypeError):
            extra = {}
        if extra.get("backend_name") == PLUGIN_BACKEND:
            return "l3"
    return str(backend)


def current_plan(*, mla: bool = True, layer_split: bool = False, fp4_kv: bool = False) -> DedupPlan:
    """The plan of this process from the published server args and topology plus the pool facts given."""
    from sglang.srt.runtime_context import get_parallel, get_server_args

    try:
        sa, par = get_server_args(), get_parallel()
    except Exception:  # noqa: BLE001 - nothing published (a tool, a unit test): SGLang's own path
        return DedupPlan("auto", False, "no published server args")
    spec = getattr(sa, "speculative_algorithm", None)
    return decide(Facts(
        mode=asked_mode(sa), tp_rank=int(par.tp_rank), tp_size=int(par.tp_size), pp_rank=int(par.pp_rank),
        pp_size=int(par.pp_size), nnodes=int(getattr(par, "nnodes", 1) or 1),
        attn_cp_size=int(getattr(par, "attn_cp_size", 1) or 1), attn_dp_size=int(getattr(par, "attn_dp_size", 1) or 1),
        mla=mla, layer_split=layer_split, fp4_kv=fp4_kv, speculative=bool(spec) and str(spec).upper() != "NONE",
        dcp=int(getattr(par, "attn_dcp_size", 1) or 1) > 1,
        kv_sharding=bool(getattr(sa, "enable_kv_cache_sharding", False)), storage=_storage(sa)))


def _device_plan(device_pool) -> DedupPlan:
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool, MLATokenToKVPoolFP4

    return current_plan(mla=isinstance(device_pool, MLATokenToKVPool),
                        fp4_kv=isinstance(device_pool, MLATokenToKVPoolFP4),
                        layer_split=bool(getattr(device_pool, "layer_shard_enabled", False)))


@dataclass
class DedupRun:
    """What a deduplicated controller needs at run time: the plan, SGLang's broadcaster over this node's group,
    a gloo group for the load-plan digest, and the anchor KV host pool."""

    plan: DedupPlan
    broadcaster: Any
    digest_group: Any
    kv_host: Any
    counters: dict = field(default_factory=lambda: {"loads": 0, "broadcast_layers": 0, "plan_mismatches": 0})


# ---------------------------------------------------------------------------------------------- host pools
def hook_mla_host_init(original, self, buffer_info, *args, **kwargs):
    """AROUND MLATokenToKVPoolHost.__init__: on a peer, the target KV pool is allocator-only (SGLang's
    MLAHostAllocation: same slots, same allocator, no buffer)."""
    from sglang.srt.mem_cache.device_pool_info import MLABufferInfo
    from sglang.srt.mem_cache.pool_host.mla import MLAHostAllocation

    plain = (isinstance(buffer_info, MLABufferInfo) and buffer_info.scales is None
             and isinstance(buffer_info.buffers, tuple) and kwargs.get("pool_label", "kv") == "kv"
             and not kwargs.get("draft_buffer_infos") and not kwargs.get("layer_shard_enabled")
             and int(kwargs.get("dcp_size", 1)) == 1)
    if not plain or not current_plan().is_peer:
        return original(self, buffer_info, *args, **kwargs)
    dim = kwargs.get("override_kv_cache_dim") or buffer_info.kv_cache_dim
    layers = int(kwargs["target_layer_num"])
    alloc = MLAHostAllocation(dtype=buffer_info.dtype, kv_lora_rank=buffer_info.kv_lora_rank,
                              qk_rope_head_dim=buffer_info.qk_rope_head_dim, kv_cache_dim=dim,
                              size_per_token=dim * buffer_info.dtype.itemsize * layers,
                              packed_fp8=buffer_info.packed_fp8)
    return original(self, alloc, *args, **kwargs)


def hook_indexer_host_init(original, self, decl, anchor_host, *args, **kwargs):
    """AROUND DSAIndexerPoolHost.__init__: the indexer of an allocator-only anchor is allocator-only too (0.5.23's
    DSAIndexerHostPoolBuilder never passes is_dummy)."""
    if getattr(anchor_host, "_is_dummy", False):
        kwargs["is_dummy"] = True
    return original(self, decl, anchor_host, *args, **kwargs)


# ---------------------------------------------------------------------------------------------- host budget
# Replicas of a deduplicated rank's pages on its node, while its host pools are sized and built (hook_auto_size):
# SGLang's guard then shares the host's RAM among the ranks that pin pools (one source a group), not every rank.
_REPLICAS: ContextVar[int] = ContextVar("glm_ext_host_dedup_replicas", default=1)


def hook_ranks_per_host(original, *args, **kwargs):
    """AROUND pool_host.base.ranks_per_host (what host_memory_budget_bytes divides the host's free RAM by): while a
    deduplicated rank builds its pools, the ranks on the host that pin host pools, one per dedup group."""
    n = original(*args, **kwargs)
    replicas = _REPLICAS.get()
    return max(1, n // replicas) if replicas > 1 else n


@contextmanager
def _pools_of_dedup_group(inner, replicas: int):
    token = _REPLICAS.set(replicas)
    try:
        with inner:
            yield
    finally:
        _REPLICAS.reset(token)


def hook_auto_size(original, params, *args, **kwargs):
    """AROUND hicache_auto_size.auto_size_hicache, the context SGLang builds every host pool in (kv_cache_builder):
    on a deduplicated rank, its auto-size budget and every pool's guard inside count one pool holder per dedup group
    on the host, so the source may pin the RAM its peers leave free. Peers compute the same (auto-sizing's world MIN
    keeps their slot counts equal to the source's); they allocate nothing."""
    inner = original(params, *args, **kwargs)
    try:
        plan = _device_plan(params.token_to_kv_pool_allocator.get_kvcache())
    except Exception:  # noqa: BLE001 - no device pool to read: SGLang's own sizing
        return inner
    if not plan.on:
        return inner
    logger.info("sglang-glm-ext host_dedup: host pools sized for one pool holder per %d replicas on this host (%s)",
                len(plan.group), "source" if plan.is_source else "peer: allocator-only")
    return _pools_of_dedup_group(inner, len(plan.group))


# ---------------------------------------------------------------------------------------------- controller
def _kv_host(controller):
    host = controller.mem_pool_host
    if hasattr(host, "get_pool"):
        from sglang.srt.mem_cache.hicache_storage import PoolName

        return host.get_pool(PoolName.KV)
    return host


def _new_groups(plan: DedupPlan, backend: str):
    """Every dedup group of the world, in the plan's order, on every rank (creation is world-collective)."""
    import torch.distributed as dist

    mine = digest = None
    for ranks in plan.groups:
        g = dist.new_group(list(ranks), backend=backend)
        d = g if backend == "gloo" else dist.new_group(list(ranks), backend="gloo")
        if ranks == plan.group:
            mine, digest = g, d
    return mine, digest


def hook_controller_init(result, self, *args, **kwargs):
    """AFTER HiCacheController.__init__: on a deduplicated rank build SGLang's broadcaster over this node's group and
    hang the run on the controller and its L2 transfer engine. Refuses (loudly, at startup) a host pool that does
    not match the rank's role."""
    dev = self.mem_pool_device
    plan = _device_plan(dev)
    if not plan.on:
        # The attach log says why a launch that asked for it (or left it to auto) keeps one host copy per rank.
        if plan.mode != "off":
            (logger.warning if plan.mode == "on" else logger.info)(
                "sglang-glm-ext host_dedup (--hicache-host-dedup %s): %s", plan.mode, plan.describe())
        return result
    kv_host = _kv_host(self)
    dummy = bool(getattr(kv_host, "_is_dummy", False))
    if dummy != plan.is_peer:
        role, pool = ("peer", "real") if plan.is_peer else ("source", "allocator-only")
        raise RuntimeError(f"sglang-glm-ext host_dedup: rank {plan.me} is the {role} of group {list(plan.group)} but "
                           f"its KV host pool is {pool}")
    from sglang.srt.mem_cache.mla_host_dedup import MLAHostDedupBroadcaster

    on_cuda = str(getattr(dev, "device", "cpu")).startswith("cuda")
    group, digest = _new_groups(plan, "nccl" if on_cuda else "gloo")
    bc = MLAHostDedupBroadcaster(dev, group, src_global_rank=plan.source)
    bc.is_src = plan.is_source  # SGLang's is_src is TP rank 0 of the whole group; here the node's first replica
    if on_cuda:
        bc._warmup_group()
    run = DedupRun(plan, bc, digest, kv_host)
    setattr(self, RUN_ATTR, run)
    setattr(self.l2_transfer_engine, RUN_ATTR, run)
    logger.info("sglang-glm-ext host_dedup: %s (%s broadcast)", plan.describe(), "NCCL" if on_cuda else "gloo")
    return result


_WRITER_CLASSES: dict = {}


def hook_storage_config(result, self, *args, **kwargs):
    """AFTER HiCacheController._generate_storage_config, after l3.cp_storage_writers: under dedup the source is the
    one storage writer of its node's group and the peers none; the plugin's backend learns the role."""
    import dataclasses

    extra = getattr(result, "extra_config", None)
    if not (isinstance(extra, dict) and extra.get("backend_name") == PLUGIN_BACKEND):
        return result
    plan = _device_plan(self.mem_pool_device)
    if not plan.on or not dataclasses.is_dataclass(result):
        return result
    tp_size = int(getattr(result, "tp_size", 1) or 1)
    extra[ROLE_KEY] = {"role": "source" if plan.is_source else "peer", "source_tp_rank": plan.source % tp_size,
                       "group": list(plan.group)}
    key = (type(result), plan.is_source)
    cls = _WRITER_CLASSES.get(key)
    if cls is None:
        writes = plan.is_source
        cls = _WRITER_CLASSES[key] = type(f"{type(result).__name__}HostDedup", (type(result),), {
            "__doc__": "HiCacheStorageConfig under host dedup: the node's source writes, its peers never "
                       "(sglang_glm_ext host_dedup.storage_writers).",
            "is_storage_writer": property(lambda s: writes)})
    return cls(**{f.name: getattr(result, f.name) for f in dataclasses.fields(result) if f.init})


# ---------------------------------------------------------------------------------------------- transfers
def hook_d2h(original, self, transfers, *args, **kwargs):
    """AROUND L2TransferEngine.submit_device_to_host: an allocator-only pool has no bytes to receive; the peer keeps
    its allocation and its ack (the controller's writing MIN then waits for the source)."""
    kept = [t for t in transfers if not getattr(t.host_pool, "_is_dummy", False)]
    return original(self, kept, *args, **kwargs)


def hook_h2d(original, self, transfers, *args, on_layer_done=None, **kwargs):
    """AROUND L2TransferEngine.submit_host_to_device: the source loads each layer, then broadcasts it; a peer skips
    its allocator-only pools and receives the layer into its own device slots, before the layer counts as done."""
    run = getattr(self, RUN_ATTR, None)
    kv = next((t for t in transfers if t.host_pool is run.kv_host), None) if run is not None else None
    if kv is None:
        return original(self, transfers, *args, on_layer_done=on_layer_done, **kwargs)
    bc = run.broadcaster
    prepared = bc.prepare_broadcast(kv.device_indices, self.host_to_device_stream)
    run.counters["loads"] += 1

    def layer_done(layer_id):
        bc.broadcast_loaded_layer(layer_id, prepared)
        run.counters["broadcast_layers"] += 1
        if on_layer_done is not None:
            on_layer_done(layer_id)

    kept = [t for t in transfers if not getattr(t.host_pool, "_is_dummy", False)]
    return original(self, kept, *args, on_layer_done=layer_done, **kwargs)


def hook_load(original, self, host_indices, *args, **kwargs):
    """AROUND HybridCacheController.load: before a load that will be broadcast, the node's group compares a digest
    of its plan (host slots in logical page order); ranks that disagree would land another request's KV or hang in
    the broadcast, so every rank refuses the load (SGLang's load-back miss: the prefix is recomputed)."""
    run = getattr(self, RUN_ATTR, None)
    if run is None or host_indices.numel() == 0:
        return original(self, host_indices, *args, **kwargs)
    import torch
    import torch.distributed as dist

    mine = plan_digest(host_indices.to("cpu", torch.int64).contiguous().numpy().tobytes())
    seen = torch.tensor([mine, -mine], dtype=torch.int64)
    dist.all_reduce(seen, op=dist.ReduceOp.MAX, group=run.digest_group)  # max == -min(-x): one collective
    if int(seen[0]) != mine or int(seen[1]) != -mine:
        run.counters["plan_mismatches"] += 1
        logger.warning("sglang-glm-ext host_dedup: the load plans of group %s differ; the load-back is refused on "
                       "every rank (a miss, recomputed)", list(run.plan.group))
        return None
    return original(self, host_indices, *args, **kwargs)
