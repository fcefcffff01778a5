"""The attach plan: every decision the backend makes, made once when SGLang has registered its host pools.

:func:`plan_attach` reads SGLang's pools and runtime context (``sglang_pools.py``) and decides: which pools are
served and how their pages map to ``PageLayout``s (``pool_plans.py``), each pool's payload kind and key tag, the
namespace, the L3 rank, and which pages this rank writes under CP (``cp_writers.py``). It returns one frozen
:class:`AttachPlan` holding one frozen :class:`PoolRecord` per served pool (as SGLang's HF3FS backend keeps one
``_PoolStorageCtx`` per pool); the data path (``datapath.py``) takes a record and has no decision left. A sidecar
draft pool SGLang registers after the attach gets its own new record (:func:`plan_late_pool`); nothing decided
earlier changes. Anything the plan cannot serve raises here (``AttachError`` / ``LayoutRefused``): SGLang fails the
attach loudly, before serving.
"""

from __future__ import annotations

import dataclasses
import types
from dataclasses import dataclass
from typing import Mapping

from ..config import L3Config
from ..disk.format import PayloadKind
from .cp_writers import Topology, TopologyError, WriterPlan
from .extra_config import ALL_REPLICAS_WRITE_ATTR, SYNC_GROUPS_KEY, AttachError
from .keys import NamespaceSpec, ShardIdentity, pool_tag
from .parts import DCP_REFUSED, LayerPart, uncovered
from .pool_plans import LayoutRefused, PoolPlan, plan_pool
from .sglang_pools import check_against_sglang_pointers, pool_geometry

__all__ = ["POOL_KINDS", "SIDECAR_POOLS", "KV", "PoolRecord", "AttachPlan", "plan_attach", "plan_late_pool"]

# SGLang's PoolName values (hicache_storage.py) -> the payload kind each is stored as.
KV = "kv"
POOL_KINDS: dict[str, PayloadKind] = {
    KV: PayloadKind.TARGET_KV,
    "indexer": PayloadKind.INDEX_K,
    "draft": PayloadKind.DRAFT_KV,
    "draft_indexer": PayloadKind.DRAFT_INDEX_K,
}
# Sidecar draft pools (non-NextN EAGLE): SGLang registers them after the storage attach at startup.
SIDECAR_POOLS = ("draft", "draft_indexer")


@dataclass(frozen=True)
class PoolRecord:
    """One served host pool, as the data path uses it: where its pages are (``plan``), the payload kind they are
    stored as, and the tag its keys are bound to (sidecar pools; None for the others)."""

    name: str
    plan: PoolPlan
    kind: PayloadKind
    tag: bytes | None

    @property
    def page_bytes(self) -> int:
        return self.plan.page_bytes


@dataclass(frozen=True)
class AttachPlan:
    """What one attach decided (read-only: ``pools`` is a mapping proxy)."""

    pools: Mapping[str, PoolRecord]
    namespace: NamespaceSpec
    rank: int                # the L3 rank: this process's position on its node (slab dir, disk, owner lock)
    topology: Topology
    writers: WriterPlan      # which pages this rank writes

    @property
    def kv(self) -> PoolRecord:
        return self.pools[KV]

    def page_bytes(self) -> dict[PayloadKind, int]:
        return {r.kind: r.page_bytes for r in self.pools.values()}

    def with_pool(self, record: PoolRecord) -> "AttachPlan":
        """This plan plus one more pool's record (a late sidecar pool): a new plan, this one unchanged."""
        pools = dict(self.pools)
        pools[record.name] = record
        return AttachPlan(types.MappingProxyType(pools), self.namespace, self.rank, self.topology, self.writers)


def plan_attach(storage_config, config: L3Config, pools: Mapping[str, object], *, host_memory_mode: str,
                topology, kv_dtype, layer_part=lambda: None) -> AttachPlan:
    """Decide everything for one attach. ``topology`` / ``kv_dtype`` / ``layer_part`` are called to read them
    (SGLang's published context): only once the cheaper refusals have passed.

    Invariant: a rank that holds its own part of each page (``layer_part()``: DSA cache layer split) gets a
    namespace naming that part (its layer-shard rank and size in the shard tag, its layer range as the namespace's
    layers), writes its part itself (owners only among the ranks holding the same part), and attaches only where
    SGLang's storage MIN groups hold every rank of its part group (``parts.uncovered``)."""
    sc = storage_config
    if host_memory_mode != "cache":
        raise AttachError(f"--hicache-host-memory-mode {host_memory_mode} is not served (host memory must be the "
                          "L2 cache tier; buffer_only is not supported by the L3 backend yet)")
    if sc.dcp_size > 1:
        raise AttachError(f"decode context parallelism (dcp_size={sc.dcp_size}) is not served: {DCP_REFUSED}")
    if KV not in pools:
        raise AttachError("no KV host pool was registered")
    for name, pool in pools.items():
        if name not in POOL_KINDS:
            raise LayoutRefused(f"host pool {name!r} ({type(pool).__name__}) is not served by L3 "
                                f"(served pools: {', '.join(POOL_KINDS)})")
    anchor = pools[KV]
    records = {name: _record(name, pool, anchor) for name, pool in pools.items()}
    if any(n in SIDECAR_POOLS for n in records) and not config.addable_kinds:
        raise AttachError(sidecar_needs_weights(config))
    part = layer_part()
    if part is not None:
        _check_layer_split(sc, part)
    shard = ShardIdentity(replicated=bool(sc.is_mla_model), tp_rank=0 if sc.is_mla_model else sc.tp_rank,
                          tp_size=1 if sc.is_mla_model else sc.tp_size, pp_rank=sc.pp_rank, pp_size=sc.pp_size,
                          dcp_rank=sc.dcp_rank, dcp_size=sc.dcp_size,
                          layer_shard_rank=part.rank if part else 0, layer_shard_size=part.size if part else 1)
    ns = NamespaceSpec(
        deployment_id=config.deployment_id,
        model=sc.model_name or "",
        kv_dtype=kv_dtype(),
        host_layout=anchor.layout,
        page_size=anchor.page_size,
        layer_start=part.layer_start if part else int(anchor.start_layer),
        layer_end=part.layer_end if part else int(anchor.end_layer) + 1,
        # Sidecar pools are bound through their keys instead (pool_keys): the namespace must not depend on
        # whether SGLang registered them before or after the store opened.
        pools=tuple(records[n].plan.fmt for n in sorted(records) if n not in SIDECAR_POOLS),
        shard=shard,
    )
    try:
        topo = topology()
        if part is not None:
            topo = dataclasses.replace(topo, cp_parts=True)
    except TopologyError as exc:
        raise AttachError(f"cannot place this rank on a node: {exc}") from exc
    if part is not None and topo.attn_cp_rank != part.rank:
        raise AttachError(f"DSA cache layer split: layer-shard rank {part.rank} but attention-CP rank "
                          f"{topo.attn_cp_rank} in the published topology")
    rank = topo.local_rank
    if not 0 <= rank < config.num_ranks:
        raise AttachError(f"this process is L3 rank {rank} of its node (tp_rank {topo.tp_rank}, pp_rank "
                          f"{topo.pp_rank}, {topo.ranks_per_node} ranks per node) but {config.source} has "
                          f"ranks.count = {config.num_ranks}; ranks.count counts one node's ranks")
    return AttachPlan(types.MappingProxyType(records), ns, rank, topo, _writer_plan(sc, topo, config.writer_mode))


def plan_late_pool(config: L3Config, name: str, pool, anchor) -> PoolRecord:
    """The record of a sidecar draft pool registered after the store opened (its kind is then added to the store)."""
    if name not in SIDECAR_POOLS:
        raise AttachError(
            f"host pool {name!r} ({type(pool).__name__}) was registered after the L3 store opened; only the "
            f"sidecar draft pools ({', '.join(SIDECAR_POOLS)}) may come later")
    if not config.addable_kinds:
        raise AttachError(sidecar_needs_weights(config))
    return _record(name, pool, anchor)


def sidecar_needs_weights(config: L3Config) -> str:
    return (f"sidecar draft pools need payload_split = 'weights' in {config.source} with a "
            "[payload_weights] entry for target_kv, index_k, draft_kv and draft_index_k: their slabs must keep "
            "one size whether SGLang registers the pools before or after the store opens (at startup it "
            "registers them after), and equal_slots sizes every kind from the kinds opened together")


def _record(name: str, pool, anchor) -> PoolRecord:
    plan = plan_pool(pool_geometry(name, pool))
    problem = check_against_sglang_pointers(plan, pool, anchor.page_num)
    if problem:
        raise LayoutRefused(f"host pool {name!r}: {problem}")
    if plan.geometry.page_size != anchor.page_size:
        raise LayoutRefused(f"host pool {name!r} pages hold {plan.geometry.page_size} tokens, KV pages "
                            f"{anchor.page_size}")
    return PoolRecord(name, plan, POOL_KINDS[name], pool_tag(plan.fmt) if name in SIDECAR_POOLS else None)


def _check_layer_split(storage_config, part: LayerPart) -> None:
    """Layer split is served only where it cannot give a partial page or leave a part unwritten."""
    if not storage_config.is_mla_model:
        raise AttachError("DSA cache layer split on a pool SGLang does not call rank-replicated (is_mla_model False)")
    if not getattr(storage_config, ALL_REPLICAS_WRITE_ATTR, False):
        raise AttachError(
            f"DSA cache layer split: CP rank {part.rank} of {part.size} holds its own layers of every page but the "
            "plugin's l3.cp_storage_writers patch is not in place, so SGLang lets only TP rank 0 write and every other "
            "part would stay empty (see `sglang-glm-ext doctor`)")
    groups = (storage_config.extra_config or {}).get(SYNC_GROUPS_KEY)
    if groups is None:
        raise AttachError("DSA cache layer split: the ranks of the controller's storage MIN groups are unknown (the "
                          "plugin's l3.storage_kv_dtype patch did not run), so a page could hit with a part missing")
    why = uncovered(part.group_ranks, groups)
    if why:
        raise AttachError(f"DSA cache layer split: {why}")


def _writer_plan(storage_config, topo: Topology, mode: str) -> WriterPlan:
    """Which pages this rank writes. Replicated pages with the writer patch in place: one owner per page among the
    node's replicas. Anything else: every page SGLang hands this rank (SGLang chose the writers)."""
    me_alone = WriterPlan(mode, (topo.tp_rank,), 0)
    if not storage_config.is_mla_model:
        return me_alone  # MHA: every TP rank writes its own shard (the namespace names it)
    if getattr(storage_config, ALL_REPLICAS_WRITE_ATTR, False):
        return WriterPlan.build(topo, mode)
    if len(topo.replicas_on_node()) != len(topo.replicas()):
        raise AttachError(
            f"the replicas of this rank's MLA/DSA pages span nodes ({len(topo.replicas())} replicas, "
            f"{len(topo.replicas_on_node())} on this node) but the plugin's l3.cp_storage_writers patch is not in "
            "place, so SGLang lets one rank write and the other nodes' L3 would stay empty (see `sglang-glm-ext "
            "doctor`)")
    return me_alone
