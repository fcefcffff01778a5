"""``L3HiCacheStorage``: SGLang's HiCache storage tier backed by the L3 engine, one per rank. SGLang-facing.

SGLang builds it through ``--hicache-storage-backend dynamic`` (the plugin's flag hook writes the extra config,
``attach.extra_config``) as ``L3HiCacheStorage(storage_config, {})``. The constructor sees no host pool; SGLang
then registers the anchor KV pool (``register_mem_pool_host``) and every pool of the ``HostPoolGroup``
(``register_mem_host_pool_v2``), and calls :meth:`on_host_pools_registered`, where the backend decides everything
once (plan): which pools it serves and how their pages map to ``PageLayout``s, the namespace, the payload kinds,
the L3 rank; then it opens a handle onto the process's one store of this (config, rank) (``L3Store.open`` shares
it among every controller that attaches). Anything it cannot serve raises there, which fails the attach loudly,
before serving. A sidecar draft pool SGLang registers after that (``maybe_register_hicache_draft`` at startup) gets
its payload kind added to the open store (``L3Store.add_kind``) or is refused the same way.

Call map (run, no decisions left):

* KV pages, zero-copy v1 (``interface_v1``): ``batch_set_v1`` -> ``L3Store.spill_from_layout`` (gather straight
  from the host pool into the engine's staging), ``batch_get_v1`` -> ``reload_into_layout`` (O_DIRECT
  straight into each layer chunk / page of the host pool, verified there), ``batch_exists`` -> ``exists``. A page is visible to both as soon as
  ``batch_set`` returned: the store serves it from staging until it is durable.
* DSA indexer (and sidecar draft) pools, v2 in the same batch under the same keys: ``batch_set_v2`` /
  ``batch_get_v2`` / ``batch_exists_v2`` on the pool's own payload kind. A sidecar draft pool's keys are bound to
  its byte format (``keys.pool_keys``), which is kept out of the store's namespace: the store's namespace is the
  same whether SGLang registered the pool before or after the store opened.
* Generic ``get`` / ``set`` / ``batch_*``: SGLang's flat page (``get_data_page``) has the same byte order as the v1
  payload for every served layout (tested), so both paths read each other's pages.

Under context parallelism (``docs_internal/l3_cp.md``) replicated (MLA/DSA) pages have a CP-rank-free namespace, so
every rank finds what any rank wrote; with the plugin's ``l3.cp_storage_writers`` patch SGLang hands every page to
every replica, and the backend writes only the pages it owns (``owners.WriterPlan``: one content owner per page among
its node's replicas), acknowledging the others as the owner's. The L3 rank is the process's position on its node.

The data path never raises into the scheduler: an I/O error, a corrupt page, a full pool, bad indices are a miss
or a dropped write, counted in :meth:`l3_stats`. :meth:`get_stats` hands SGLang its ``StorageMetrics`` by swapping
bounded sample buffers (no work proportional to the store).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, List, Optional

import numpy as np
import torch

from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
    PoolTransferResult,
)

from ..config import L3Config, L3ConfigError
from ..errors import L3StoreError
from ..format import PayloadKind
from . import metrics as hicache_metrics
from .attach import ALL_REPLICAS_WRITE_ATTR, AttachError, parse_extra_config
from .keys import NamespaceSpec, ShardIdentity, pool_keys, pool_tag, storage_key, storage_keys
from .layouts import Buffer, LayoutRefused, PoolGeometry, PoolPlan, plan_pool
from .owners import Topology, TopologyError, WriterPlan

logger = logging.getLogger("sglang_glm_ext")

__all__ = ["L3HiCacheStorage", "POOL_KINDS"]

POOL_KINDS: dict[str, PayloadKind] = {
    PoolName.KV.value: PayloadKind.TARGET_KV,
    PoolName.INDEXER.value: PayloadKind.INDEX_K,
    PoolName.DRAFT.value: PayloadKind.DRAFT_KV,
    PoolName.DRAFT_INDEXER.value: PayloadKind.DRAFT_INDEX_K,
}
# Sidecar draft pools (non-NextN EAGLE): SGLang registers them after the storage attach at startup.
SIDECAR_POOLS = (PoolName.DRAFT.value, PoolName.DRAFT_INDEXER.value)
_SAMPLES = 1024  # per get_stats() interval; older samples of a long interval are dropped, never grow memory


class _Counters:
    __slots__ = ("set_pages", "set_dropped", "set_not_owned", "get_pages", "get_hits", "get_misses", "exists_calls",
                 "bad_indices", "unknown_pool", "errors", "not_ready")

    def __init__(self):
        for name in self.__slots__:
            setattr(self, name, 0)

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__slots__}


def _pool_name(name) -> str:
    return name.value if isinstance(name, PoolName) else str(name)


def _indices_np(host_indices) -> np.ndarray:
    if isinstance(host_indices, torch.Tensor):
        t = host_indices.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        return t.reshape(-1).numpy().astype(np.int64, copy=False)
    return np.asarray(host_indices, dtype=np.int64).reshape(-1)


# ---------------------------------------------------------------------------------------------- geometry
def pool_geometry(name: str, pool) -> PoolGeometry:
    """Read one SGLang host pool's geometry. Raises LayoutRefused for pools the backend does not serve."""
    from sglang.srt.mem_cache.pool_host.dsa import DSAIndexerPoolHost
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

    cls = type(pool)
    where = f"host pool {name!r} ({cls.__module__}.{cls.__name__})"
    if cls not in (MLATokenToKVPoolHost, DSAIndexerPoolHost, MHATokenToKVPoolHost):
        raise LayoutRefused(
            f"{where} is not served by L3: it serves MLA/DSA (GLM-5) and MHA (GLM-4.x) KV and the DSA indexer; "
            "Mamba, SWA, DeepSeek-V4 compressed, HiSparse, FP4/MXFP8-scaled and page-envelope pools are refused")
    if getattr(pool, "dcp_size", 1) != 1:
        raise LayoutRefused(f"{where}: decode context parallelism (dcp_size={pool.dcp_size}) is not served")
    layout = pool.layout
    if cls is MLATokenToKVPoolHost:
        if getattr(pool, "_is_dummy", False) or pool.kv_buffer is None:
            raise LayoutRefused(f"{where}: allocator-only MLA host pool holds no bytes to store")
        if getattr(pool, "_layer_shard_enabled", False):
            raise LayoutRefused(f"{where}: CP layer-sharded MLA host pool is not served (next issue)")
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


def _kv_dtype(storage_config: HiCacheStorageConfig, pools: dict) -> str:
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


def _topology(storage_config: HiCacheStorageConfig) -> Topology:
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


def _writer_plan(storage_config: HiCacheStorageConfig, topo: Topology, mode: str) -> WriterPlan:
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


def _host_memory_mode() -> str:
    try:
        from sglang.srt.runtime_context import get_memory

        return get_memory().hicache_host_memory_mode
    except Exception:  # noqa: BLE001 - nothing published (unit tests): the default
        return "cache"


# ---------------------------------------------------------------------------------------------- backend
class L3HiCacheStorage(HiCacheStorage):
    """One rank's L3 tier for SGLang's HiCache. Invariant: after :meth:`on_host_pools_registered` returned, every
    data-path method returns a result of the promised shape and never raises."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict] = None):
        self.storage_config = storage_config
        try:
            self.extra = parse_extra_config(storage_config.extra_config)
            self.config = L3Config.load(self.extra["l3_config"])
        except (AttachError, L3ConfigError, OSError) as exc:
            raise AttachError(f"sglang-glm-ext L3 backend: {exc}") from exc
        self.pools: dict[str, Any] = {}
        self.plans: dict[str, PoolPlan] = {}
        self.kinds: dict[str, PayloadKind] = {}
        self._tags: dict[str, bytes | None] = {}  # sidecar pools: the format tag their keys are bound to
        self.namespace: NamespaceSpec | None = None
        self.rank: int | None = None  # the L3 rank: this process's position on its node (slab dir, disk, owner lock)
        # CP identity as SGLang derives it from the attention-CP group (what its storage metrics are labelled with)
        self.cp_rank: int = int(getattr(storage_config, "attn_cp_rank", 0) or 0)
        self.cp_size: int = int(getattr(storage_config, "attn_cp_size", 1) or 1)
        self.topology: Topology | None = None
        self.writers: WriterPlan | None = None  # which pages this rank writes (set at attach)
        self._store = None  # an L3Store handle (this attach's reference on the process's shared store)
        self._kv: PoolPlan | None = None
        self._ready = False
        self._closed = False
        self.c = _Counters()
        self._mlock = threading.Lock()
        self._m = self._new_samples()
        self._metrics = None  # the L3 metrics registration (hicache/metrics.py), when --enable-metrics
        # What SGLang's batch_set waits for (issue 20, items 7 and 8): staging room up to wait_ms, and with
        # ack = "durable" the pages' durability too.
        self._wait = self.config.wait_ms / 1000.0
        self._durable = self.config.ack == "durable"

    # ------------------------------------------------------------------ registration (control path)
    def register_mem_pool_host(self, mem_pool_host) -> None:
        super().register_mem_pool_host(mem_pool_host)
        self._register(PoolName.KV.value, mem_pool_host)

    def register_mem_host_pool_v2(self, host_pool, host_pool_name) -> None:
        super().register_mem_host_pool_v2(host_pool, host_pool_name)
        self._register(_pool_name(host_pool_name), host_pool)

    def _register(self, name: str, pool) -> None:
        known = self.pools.get(name)
        if known is pool:
            return
        if known is not None:
            raise AttachError(f"sglang-glm-ext L3 backend: host pool {name!r} registered twice with different pools")
        if self._ready:
            # SGLang registers sidecar draft pools after the storage attach at startup: their kinds join the store.
            if name not in SIDECAR_POOLS:
                raise AttachError(
                    f"sglang-glm-ext L3 backend: host pool {name!r} ({type(pool).__name__}) was registered after "
                    f"the L3 store opened; only the sidecar draft pools ({', '.join(SIDECAR_POOLS)}) may come later")
            try:
                self._serve_late(name, pool)
            except (AttachError, LayoutRefused, L3ConfigError, L3StoreError) as exc:
                raise AttachError(f"sglang-glm-ext L3 backend cannot serve host pool {name!r} registered after "
                                  f"the store opened: {exc}") from exc
        self.pools[name] = pool

    def on_host_pools_registered(self) -> None:
        try:
            self._plan_and_open()
        except (AttachError, LayoutRefused, L3ConfigError) as exc:
            raise AttachError(f"sglang-glm-ext L3 backend cannot attach: {exc}") from exc
        except Exception as exc:  # L3StoreError (paths, locks, PLP, budget) and anything unexpected: loud
            raise AttachError(f"sglang-glm-ext L3 backend cannot attach: {type(exc).__name__}: {exc}") from exc

    def _plan_and_open(self) -> None:
        sc = self.storage_config
        mode = _host_memory_mode()
        if mode != "cache":
            raise AttachError(f"--hicache-host-memory-mode {mode} is not served (host memory must be the L2 "
                              "cache tier; buffer_only is not supported by the L3 backend yet)")
        if sc.dcp_size > 1:
            raise AttachError(f"decode context parallelism (dcp_size={sc.dcp_size}) is not served")
        if PoolName.KV.value not in self.pools:
            raise AttachError("no KV host pool was registered")
        for name, pool in self.pools.items():
            if name not in POOL_KINDS:
                raise LayoutRefused(f"host pool {name!r} ({type(pool).__name__}) is not served by L3 "
                                    f"(served pools: {', '.join(POOL_KINDS)})")
        anchor = self.pools[PoolName.KV.value]
        plans = {name: self._plan(name, pool, anchor) for name, pool in self.pools.items()}
        shard = ShardIdentity(replicated=bool(sc.is_mla_model), tp_rank=0 if sc.is_mla_model else sc.tp_rank,
                              tp_size=1 if sc.is_mla_model else sc.tp_size, pp_rank=sc.pp_rank, pp_size=sc.pp_size,
                              dcp_rank=sc.dcp_rank, dcp_size=sc.dcp_size)
        ns = NamespaceSpec(
            deployment_id=self.config.deployment_id,
            model=sc.model_name or "",
            kv_dtype=_kv_dtype(sc, self.pools),
            host_layout=anchor.layout,
            page_size=anchor.page_size,
            layer_start=int(anchor.start_layer),
            layer_end=int(anchor.end_layer) + 1,
            # Sidecar pools are bound through their keys instead (pool_keys): the namespace must not depend on
            # whether SGLang registered them before or after the store opened.
            pools=tuple(plans[n].fmt for n in sorted(plans) if n not in SIDECAR_POOLS),
            shard=shard,
        )
        try:
            topo = _topology(sc)
        except TopologyError as exc:
            raise AttachError(f"cannot place this rank on a node: {exc}") from exc
        rank = topo.local_rank
        if not 0 <= rank < self.config.num_ranks:
            raise AttachError(f"this process is L3 rank {rank} of its node (tp_rank {topo.tp_rank}, pp_rank "
                              f"{topo.pp_rank}, {topo.ranks_per_node} ranks per node) but {self.config.source} has "
                              f"ranks.count = {self.config.num_ranks}; ranks.count counts one node's ranks")
        writers = _writer_plan(sc, topo, self.config.writer_mode)
        kinds = {name: POOL_KINDS[name] for name in plans}
        if any(n in SIDECAR_POOLS for n in plans) and not self.config.addable_kinds:
            raise AttachError(self._sidecar_needs_weights())
        page_bytes = {kinds[n]: plans[n].page_bytes for n in plans}
        from ..store import L3Store

        store = L3Store.open(self.config, rank=rank, namespace=ns.to_namespace(), page_bytes=page_bytes)
        self._tags = {n: pool_tag(plans[n].fmt) if n in SIDECAR_POOLS else None for n in plans}
        self.kinds, self.namespace, self.rank, self._store = kinds, ns, rank, store
        self.topology, self.writers = topo, writers
        self.plans = plans
        self._kv = plans[PoolName.KV.value]
        self._kv_kind = kinds[PoolName.KV.value]
        self._ready = True
        self._metrics = hicache_metrics.attach(self)
        st = store.stats()
        logger.info("sglang-glm-ext L3 backend attached: rank %d (cp %d/%d, writes %s of %d writer(s)), pools %s, "
                    "namespace %s, cold_start=%s (%d pages loaded), %d attach(es) share the store", rank,
                    self.cp_rank, self.cp_size, "its share" if writers.me >= 0 else "nothing", len(writers.writers),
                    {n: f"{p.fmt.layout}/{p.page_bytes}B" for n, p in plans.items()}, ns.sealed_digest().hex(),
                    st["cold_start"], st["cold_start_loaded_pages"], store.shared.refs)

    def _plan(self, name: str, pool, anchor) -> PoolPlan:
        plan = plan_pool(pool_geometry(name, pool))
        problem = check_against_sglang_pointers(plan, pool, anchor.page_num)
        if problem:
            raise LayoutRefused(f"host pool {name!r}: {problem}")
        if plan.geometry.page_size != anchor.page_size:
            raise LayoutRefused(f"host pool {name!r} pages hold {plan.geometry.page_size} tokens, KV pages "
                                f"{anchor.page_size}")
        return plan

    def _sidecar_needs_weights(self) -> str:
        return (f"sidecar draft pools need payload_split = 'weights' in {self.config.source} with a "
                "[payload_weights] entry for target_kv, index_k, draft_kv and draft_index_k: their slabs must keep "
                "one size whether SGLang registers the pools before or after the store opens (at startup it "
                "registers them after), and equal_slots sizes every kind from the kinds opened together")

    def _serve_late(self, name: str, pool) -> None:
        """A sidecar draft pool registered after the store opened: plan it like the others, add its payload kind
        to the open store, then let the data path see it (kind and tag before the plan)."""
        if not self.config.addable_kinds:
            raise AttachError(self._sidecar_needs_weights())
        plan = self._plan(name, pool, self.pools[PoolName.KV.value])
        kind = POOL_KINDS[name]
        self._store.add_kind(kind, plan.page_bytes)
        self._tags[name] = pool_tag(plan.fmt)
        self.kinds[name] = kind
        self.plans[name] = plan
        logger.info("sglang-glm-ext L3 backend: late host pool %r served as %s (%s/%dB)", name, kind.label,
                    plan.fmt.layout, plan.page_bytes)

    # ------------------------------------------------------------------ helpers (data path)
    @property
    def store(self):
        """This attach's L3Store handle (None before the attach and after close)."""
        return self._store

    @staticmethod
    def _new_samples():
        return {k: [] for k in ("prefetch_pgs", "backup_pgs", "prefetch_bandwidth", "backup_bandwidth")}

    def _sample(self, op: str, pages: int, nbytes: int, seconds: float) -> None:
        # Plain lists, each capped at _SAMPLES per get_stats() interval (later samples of a long interval are
        # dropped): get_stats hands them over without a copy. An I/O thread that took the old dict just before a
        # swap may add one sample to a list the collector is iterating: a list iterator tolerates that.
        m = self._m
        pgs = m[f"{op}_pgs"]
        if len(pgs) < _SAMPLES:
            pgs.append(pages)
            if seconds > 0:
                m[f"{op}_bandwidth"].append(nbytes / seconds / 1e9)

    def _owned(self, raw_keys: list) -> list | None:
        """None: this rank writes every page; else one bool per page (its own vs another replica's)."""
        w = self.writers
        return None if w is None or w.writes_everything else w.owned(raw_keys)

    def _spill(self, kind, plan: PoolPlan, keys, host_indices, tag=None) -> List[bool]:
        """Pages another replica owns are acknowledged (True) without a write: the owner writes the same bytes, and
        if it fails they are a miss for every rank (never a hang, never other bytes)."""
        n = len(keys)
        if not n:
            return []
        if not self._ready or self._closed:
            self.c.not_ready += n
            return [False] * n
        try:
            pages = plan.pages(_indices_np(host_indices), n)
            if pages is None:
                self.c.bad_indices += n
                self.c.set_dropped += n
                return [False] * n
            raw = storage_keys(keys)
            own = self._owned(raw)
            out = [True] * n
            t0 = time.perf_counter()
            others: list = []
            if own is not None:
                mine = [i for i in range(n) if own[i]]
                others = [i for i in range(n) if not own[i]]
                self.c.set_not_owned += len(others)
                all_raw = raw
                raw = [raw[i] for i in mine]
                pages = [pages[i] for i in mine]
            else:
                mine = range(n)
            if mine:
                skeys = pool_keys(raw, tag)
                # SGLang's backup thread: a full staging waits (bounded) instead of dropping; ack = "durable"
                # answers once the pages are durable (l3_hicache.md, "What a write-back acknowledgement means").
                ok = self._store.spill_from_layout(kind, skeys, plan.layout, pages, wait=self._wait,
                                                   durable=self._durable)
                accepted = sum(ok)
                self.c.set_pages += accepted
                self.c.set_dropped += len(ok) - accepted
                self._sample("backup", accepted, accepted * plan.page_bytes, time.perf_counter() - t0)
                for i, hit in zip(mine, ok):
                    out[i] = bool(hit)
            if others and self._durable:
                # Pages another rank owns and writes: durable once the owner committed them (the shared index).
                left = max(0.0, self._wait - (time.perf_counter() - t0))
                got = self._store.wait_durable(kind, pool_keys([all_raw[i] for i in others], tag), left)
                for i, hit in zip(others, got):
                    out[i] = bool(hit)
            return out
        except Exception:  # noqa: BLE001 - never into the scheduler
            logger.exception("sglang-glm-ext L3: write of %d pages dropped", n)
            self.c.errors += 1
            self.c.set_dropped += n
            return [False] * n

    def _reload(self, kind, plan: PoolPlan, keys, host_indices, tag=None) -> List[bool]:
        n = len(keys)
        if not n:
            return []
        if not self._ready or self._closed:
            self.c.not_ready += n
            return [False] * n
        try:
            pages = plan.pages(_indices_np(host_indices), n)
            if pages is None:
                self.c.bad_indices += n
                self.c.get_misses += n
                return [False] * n
            skeys = pool_keys(storage_keys(keys), tag)
            t0 = time.perf_counter()
            ok = self._store.reload_into_layout(kind, skeys, plan.layout, pages)  # staged pages too
            hits = sum(ok)
            self.c.get_pages += n
            self.c.get_hits += hits
            self.c.get_misses += n - hits
            self._sample("prefetch", hits, hits * plan.page_bytes, time.perf_counter() - t0)
            return ok
        except Exception:  # noqa: BLE001
            logger.exception("sglang-glm-ext L3: read of %d pages failed (misses)", n)
            self.c.errors += 1
            self.c.get_misses += n
            return [False] * n

    def _exists_prefix(self, kind, skeys: list) -> int:
        return self._store.exists(kind, skeys)  # durable or staged: visible as soon as batch_set returned

    def _plan_for(self, name):
        name = _pool_name(name)
        plan = self.plans.get(name)  # set last (_serve_late): a plan seen here has its kind and tag
        return plan, self.kinds.get(name), self._tags.get(name)

    # ------------------------------------------------------------------ v1: KV pages, zero-copy
    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        if self._kv is None:
            self.c.not_ready += len(keys)
            return [False] * len(keys)
        return self._spill(self._kv_kind, self._kv, keys, host_indices)

    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        if self._kv is None:
            self.c.not_ready += len(keys)
            return [False] * len(keys)
        return self._reload(self._kv_kind, self._kv, keys, host_indices)

    def batch_exists(self, keys: List[str], extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        if not keys:
            return 0
        if not self._ready or self._closed:
            return 0
        try:
            self.c.exists_calls += 1
            return self._exists_prefix(self._kv_kind, storage_keys(keys))
        except Exception:  # noqa: BLE001
            self.c.errors += 1
            return 0

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    # ------------------------------------------------------------------ v2: sidecar pools in the same batch
    def batch_exists_v2(self, keys: List[str], pool_transfers: Optional[List[PoolTransfer]] = None,
                        extra_info: Optional[HiCacheStorageExtraInfo] = None) -> PoolTransferResult:
        if not keys or not self._ready or self._closed:
            return PoolTransferResult.empty()
        try:
            self.c.exists_calls += 1
            skeys = storage_keys(keys)
            kv_pages = self._exists_prefix(self._kv_kind, skeys)
            hits: dict = {PoolName.KV: kv_pages} if kv_pages else {}
            final = kv_pages
            for transfer in pool_transfers or ():
                if not final:
                    break
                plan, kind, tag = self._plan_for(transfer.name)
                if plan is None or transfer.hit_policy != PoolHitPolicy.ALL_PAGES:
                    self.c.unknown_pool += 1
                    final = 0
                    break
                boundary = self._exists_prefix(kind, pool_keys(skeys[:final], tag))
                if boundary:
                    hits[transfer.name] = boundary
                final = min(final, boundary)
            return PoolTransferResult(final, hits, list(range(1, final + 1)))
        except Exception:  # noqa: BLE001
            self.c.errors += 1
            return PoolTransferResult.empty()

    def _batch_v2(self, transfers: List[PoolTransfer], op) -> dict:
        out: dict = {}
        for transfer in transfers or ():
            try:
                keys = list(transfer.keys or [])
                plan, kind, tag = self._plan_for(transfer.name)
                if plan is None:
                    self.c.unknown_pool += 1
                    out[transfer.name] = [False] * len(keys)
                    continue
                if transfer.host_indices is None:
                    self.c.bad_indices += len(keys)
                    out[transfer.name] = [False] * len(keys)
                    continue
                out[transfer.name] = op(kind, plan, keys, transfer.host_indices, tag)
            except Exception:  # noqa: BLE001 - a malformed transfer costs only its own pool's pages
                self.c.errors += 1
                name = getattr(transfer, "name", None)
                out[name] = [False] * len(getattr(transfer, "keys", None) or [])
        return out

    def batch_get_v2(self, transfers: List[PoolTransfer],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> dict:
        return self._batch_v2(transfers, self._reload)

    def batch_set_v2(self, transfers: List[PoolTransfer],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> dict:
        return self._batch_v2(transfers, self._spill)

    # ------------------------------------------------------------------ generic (flat pages) path
    def _flat(self, tensor) -> np.ndarray | None:
        if tensor is None or not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu":
            return None
        if not tensor.is_contiguous() or tensor.nbytes != self._kv.page_bytes:
            return None
        return tensor.view(-1).view(torch.uint8).numpy()

    def get(self, key: str, target_location: Optional[Any] = None, target_sizes: Optional[Any] = None):
        got = self.batch_get([key], [target_location])
        return got[0] if got else None

    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> List[torch.Tensor | None]:
        n = len(keys)
        if not self._ready or self._closed or target_locations is None:
            return [None] * n
        try:
            dsts = [self._flat(t) for t in target_locations]
            out: list = [None] * n
            todo = [i for i in range(n) if dsts[i] is not None]
            self.c.bad_indices += n - len(todo)
            if todo:
                skeys = [storage_key(keys[i]) for i in todo]
                ok = self._store.reload_into(self._kv_kind, skeys, [dsts[i] for i in todo])
                for i, hit in zip(todo, ok):
                    if hit:
                        out[i] = target_locations[i]
            hits = sum(x is not None for x in out)
            self.c.get_pages += n
            self.c.get_hits += hits
            self.c.get_misses += n - hits
            return out
        except Exception:  # noqa: BLE001
            self.c.errors += 1
            return [None] * n

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        return self.batch_set([key], [value])

    def batch_set(self, keys: List[str], values: Optional[Any] = None, target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        n = len(keys)
        if not self._ready or self._closed or values is None:
            return False
        try:
            pages = [self._flat(v) for v in values]
            if any(p is None for p in pages):
                self.c.bad_indices += n
                self.c.set_dropped += n
                return False
            skeys = storage_keys(keys)
            own = self._owned(skeys)
            others = []
            t0 = time.perf_counter()
            if own is not None:
                self.c.set_not_owned += n - sum(own)
                others = [k for k, o in zip(skeys, own) if not o]
                skeys = [k for k, o in zip(skeys, own) if o]
                pages = [p for p, o in zip(pages, own) if o]
            ok = self._store.spill(self._kv_kind, skeys, pages, wait=self._wait, durable=self._durable) if skeys else []
            self.c.set_pages += sum(ok)
            self.c.set_dropped += len(ok) - sum(ok)
            if others and self._durable:
                ok += self._store.wait_durable(self._kv_kind, others,
                                               max(0.0, self._wait - (time.perf_counter() - t0)))
            return all(ok)
        except Exception:  # noqa: BLE001
            self.c.errors += 1
            return False

    # ------------------------------------------------------------------ control
    def clear(self) -> bool:
        """SGLang's clear_storage_backend / flush_cache: drop this rank's pages (every attacher of this store
        shares them, as they share the disk)."""
        if not self._ready or self._closed:
            return False
        try:
            return bool(self._store.clear())
        except Exception:  # noqa: BLE001
            logger.exception("sglang-glm-ext L3: clear failed")
            self.c.errors += 1
            return False

    def close(self) -> None:
        """Detach / shutdown: close this attach's handle; the last handle of the process's store flushes and
        closes it, which releases its slab, owner and index locks."""
        if self._closed:
            return
        self._closed = True
        self._ready = False
        hicache_metrics.detach(self._metrics)  # its final push reads the store: before the handle closes
        self._metrics = None
        store, self._store = self._store, None
        if store is not None:
            try:
                store.close()
            except Exception:  # noqa: BLE001 - shutdown goes on; the store logged what failed
                logger.exception("sglang-glm-ext L3: closing the store failed")

    def get_stats(self):
        """SGLang's StorageMetrics since the last call (scheduler thread, every tick) in O(1): swaps in fresh sample
        lists and hands the old ones over, no copy, no store call; None (SGLang's "nothing") if that fails."""
        try:
            from sglang.srt.observability.metrics_collector import StorageMetrics

            with self._mlock:
                m, self._m = self._m, self._new_samples()
            return StorageMetrics(prefetch_pgs=m["prefetch_pgs"], backup_pgs=m["backup_pgs"],
                                  prefetch_bandwidth=m["prefetch_bandwidth"], backup_bandwidth=m["backup_bandwidth"])
        except Exception:  # noqa: BLE001 - never into the scheduler
            self.c.errors += 1
            return None

    def l3_stats(self) -> dict:
        """Backend counters plus the engine's (doctor, tests, the metrics issue)."""
        out = {"backend": self.c.as_dict(), "rank": self.rank, "ready": self._ready, "cp_rank": self.cp_rank,
               "cp_size": self.cp_size}
        if self.writers is not None:
            out["writers"] = {"mode": self.writers.mode, "tp_ranks": list(self.writers.writers), "me": self.writers.me}
        store = self._store
        if store is not None:
            out["store"] = store.stats()
            out["store_refs"] = store.shared.refs
        if self.namespace is not None:
            out["namespace"] = self.namespace.describe()
        return out
