"""``L3HiCacheStorage``: SGLang's HiCache storage tier backed by the L3 engine, one per rank. SGLang-facing.

A thin adapter between SGLang's ``HiCacheStorage`` interface and the backend's two halves:

* plan (``plan.py``), at attach: SGLang builds the backend through ``--hicache-storage-backend dynamic`` (the
  plugin's flag hook writes the extra config, ``extra_config.build``) as ``L3HiCacheStorage(storage_config, {})``,
  registers the anchor KV pool (``register_mem_pool_host``) and every pool of the ``HostPoolGroup``
  (``register_mem_host_pool_v2``), and calls :meth:`on_host_pools_registered`. There the plan decides everything
  once (served pools as frozen per-pool records, namespace, L3 rank, CP writers) and the backend opens a handle
  onto the process's one store of this (config, rank) (``L3Store.open`` shares it among every controller that
  attaches). Anything it cannot serve raises there, which fails the attach loudly, before serving. A sidecar draft
  pool SGLang registers later (``maybe_register_hicache_draft`` at startup) gets a new record and its payload kind
  is added to the open store (``L3Store.add_kind``), or it is refused the same way.
* run (``datapath.py``): each SGLang method below hands its call to the data path in a line, through :meth:`_run`,
  the data path's one guard (attached and not closed) and one error net: the data path never raises into the
  scheduler (an I/O error, a corrupt page, a full pool, bad indices are a miss or a dropped write, counted).

Call map: KV pages zero-copy (``interface_v1``): ``batch_set_v1`` -> ``L3Store.spill_from_layout`` (gathered
straight from the host pool into the engine's staging), ``batch_get_v1`` -> ``L3Store.reload_into_layout``
(O_DIRECT straight into each layer chunk / page of the host pool, verified there), ``batch_exists`` ->
``L3Store.exists``; a page is visible to both as soon as ``batch_set`` returned (the store serves it from staging
until it is durable). The DSA indexer (and sidecar draft) pools: ``*_v2`` in the same batch under the same keys, on
the pool's own payload kind (a sidecar pool's keys are bound to its byte format, ``keys.pool_keys``). Generic
``get`` / ``set`` / ``batch_*``: SGLang's flat page has the v1 payload's byte order for every served layout.

Under context parallelism (``docs_internal/l3_cp.md``) replicated (MLA/DSA) pages have a CP-rank-free namespace and,
with the plugin's ``l3.cp_storage_writers`` patch, each page is written by one owner among its node's replicas
(``cp_writers.WriterPlan``); under DSA cache layer split each CP rank's part has a namespace of its own and the rank
writes it itself (``parts.LayerPart``). Under host dedup (the ``host_dedup`` feature puts the rank's role in the extra
config) the node's source writes every page, each into its owner's store (every writer's slabs and disks, as without
dedup: ``_open_writer_stores``), and a peer, whose pools are allocator-only,
attaches with no store: it reads and writes nothing and the controller's MINs give it the source's counts
(``docs_internal/host_dedup.md``). :meth:`get_stats` hands SGLang its ``StorageMetrics`` by swapping bounded
sample lists.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import types
from typing import Any, Callable, List, Optional

import torch

from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
    PoolTransfer,
    PoolTransferResult,
)

from ..config import L3Config, L3ConfigError
from ..errors import L3StoreError
from . import extra_config, metrics, sglang_pools
from .datapath import BackendCounters, DataPath, Samples
from .extra_config import AttachError
from .plan import KV, POOL_KINDS, SIDECAR_POOLS, AttachPlan, plan_attach, plan_late_pool
from .pool_plans import LayoutRefused

logger = logging.getLogger("sglang_glm_ext")

__all__ = ["L3HiCacheStorage", "POOL_KINDS", "SIDECAR_POOLS"]

_LOG_EVERY_S = 60.0  # a data-path exception is logged with its traceback at most once a minute (all are counted)


def _count(items) -> int:
    try:
        return len(items)
    except TypeError:
        return 0


def _misses(n: int) -> list:
    return [False] * n


def _nones(n: int) -> list:
    return [None] * n


DEDUP_KEY = "host_dedup"  # extra config: {"role": "source"|"peer", "source_tp_rank", "group"} (host_dedup feature)
_NO_PLAN = types.SimpleNamespace(kv=None, pools={})


class _PeerPath:
    """The run of a host-dedup peer: it holds no bytes, so it reads and writes nothing and answers every page as
    present and loaded. The controller's MIN groups over hits and completions then give every rank the source's
    counts: a peer never claims a page the source did not land, and never waits on a read nobody does."""

    store = None

    def __init__(self, c: BackendCounters):
        self.c = c

    def reload(self, rec, keys, host_indices) -> list[bool]:
        return [True] * _count(keys)

    def spill(self, rec, keys, host_indices) -> list[bool]:
        self.c.set_not_owned += _count(keys)  # never called (peers are no storage writers); acknowledged unwritten
        return [True] * _count(keys)

    def exists(self, pools, keys, transfers=()) -> tuple[int, dict]:
        n = _count(keys)
        return n, {"kv": n, **{t.name: n for t in transfers or ()}}

    def transfer(self, pools, transfer, op: Callable) -> list[bool]:
        return op(None, getattr(transfer, "keys", None) or (), getattr(transfer, "host_indices", None))

    def get_flat(self, rec, keys, dst) -> list:
        return _nones(_count(keys))  # the generic path is not the plugin's (interface_v1); a miss, never bytes

    def set_flat(self, rec, keys, values) -> bool:
        return False


class L3HiCacheStorage(HiCacheStorage):
    """One rank's L3 tier for SGLang's HiCache. Invariant: every data-path method returns a result of the promised
    shape and never raises; before :meth:`on_host_pools_registered` and after :meth:`close` it is a miss."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict] = None):
        self.storage_config = storage_config
        try:
            self.extra = extra_config.parse(storage_config.extra_config)
            self.config = L3Config.load_once(self.extra["l3_config"])
        except (AttachError, L3ConfigError, OSError) as exc:
            raise AttachError(f"sglang-glm-ext L3 backend: {exc}") from exc
        self.pools: dict[str, Any] = {}  # what SGLang registered (control path)
        self.plan: AttachPlan | None = None  # set once attached; replaced whole when a late pool joins
        # CP identity as SGLang derives it from the attention-CP group (what its storage metrics are labelled with)
        self.cp_rank: int = int(getattr(storage_config, "attn_cp_rank", 0) or 0)
        self.cp_size: int = int(getattr(storage_config, "attn_cp_size", 1) or 1)
        self.c = BackendCounters()
        self._samples = Samples()
        self._path: DataPath | None = None  # the run: set last at attach, cleared first at close
        self._store = None  # this attach's reference on the process's shared store
        self._writer_stores: dict = {}  # writer index -> store this process writes (a dedup source: every writer's)
        self._metrics = None  # the L3 metrics registration, when --enable-metrics
        self._closed = False
        self._last_log = 0.0
        self._peer: dict | None = None  # host dedup: this rank's role when it is a peer

    # ------------------------------------------------------------------ plan (control path)
    def register_mem_pool_host(self, mem_pool_host) -> None:
        super().register_mem_pool_host(mem_pool_host)
        self._register(KV, mem_pool_host)

    def register_mem_host_pool_v2(self, host_pool, host_pool_name) -> None:
        super().register_mem_host_pool_v2(host_pool, host_pool_name)
        self._register(sglang_pools.pool_name(host_pool_name), host_pool)

    def _register(self, name: str, pool) -> None:
        known = self.pools.get(name)
        if known is pool:
            return
        if known is not None:
            raise AttachError(f"sglang-glm-ext L3 backend: host pool {name!r} registered twice with different pools")
        if self._peer is not None and not sglang_pools.allocator_only(pool):
            raise AttachError(f"sglang-glm-ext L3 backend: host pool {name!r} holds bytes but this rank is a "
                              "host-dedup peer, which reads nothing")
        if self.plan is not None:
            self._serve_late(name, pool)
        self.pools[name] = pool

    def on_host_pools_registered(self) -> None:
        sc = self.storage_config
        dedup = (sc.extra_config or {}).get(DEDUP_KEY) or {}
        if dedup.get("role") == "peer":
            return self._attach_peer(dedup)
        try:
            plan = plan_attach(sc, self.config, self.pools, host_memory_mode=sglang_pools.host_memory_mode(),
                               topology=lambda: sglang_pools.topology(sc),
                               kv_dtype=lambda: sglang_pools.kv_dtype(sc, self.pools),
                               layer_part=lambda: sglang_pools.layer_part(sc, self.pools))
            from ..engine.store import L3Store

            store = L3Store.open(self.config, rank=plan.rank, namespace=plan.namespace.to_namespace(),
                                 page_bytes=plan.page_bytes())
            stores = {plan.writers.me: store} if plan.writers.me >= 0 else {}
            if dedup.get("role") == "source":  # the node's one copy: every writer's share, into its own store
                stores = self._open_writer_stores(plan, store)
        except (AttachError, LayoutRefused, L3ConfigError) as exc:
            raise AttachError(f"sglang-glm-ext L3 backend cannot attach: {exc}") from exc
        except Exception as exc:  # L3StoreError (paths, locks, PLP, budget) and anything unexpected: loud
            raise AttachError(f"sglang-glm-ext L3 backend cannot attach: {type(exc).__name__}: {exc}") from exc
        self.plan, self._store, self._writer_stores = plan, store, stores
        self._path = DataPath(store, plan.writers, self.c, self._samples, wait=self.config.wait_ms / 1000.0,
                              durable=self.config.ack == "durable", stores=stores)
        self._metrics = metrics.attach(self)
        st = store.stats()
        logger.info("sglang-glm-ext L3 backend attached: rank %d (cp %d/%d, writes %s of %d writer(s)), pools %s, "
                    "namespace %s (%s), cold_start=%s (%d pages loaded), %d attach(es) share the store", plan.rank,
                    self.cp_rank, self.cp_size, "its share" if plan.writers.me >= 0 else "nothing",
                    len(plan.writers.writers),
                    {n: f"{r.plan.fmt.layout}/{r.page_bytes}B" for n, r in plan.pools.items()},
                    plan.namespace.sealed_digest().hex(), plan.namespace.shard.tag(), st["cold_start"],
                    st["cold_start_loaded_pages"], store.shared.refs)

    def _open_writer_stores(self, plan, store) -> dict:
        """A host-dedup source writes for its node's writers (``writers.mode``: every replica under ``spread``, the
        first under ``one_per_node``): each writer's share goes into that writer's own store (its rank's slabs and
        disks, budget and owner lock; its peers open none), so L3 keeps the capacity and drives of every rank, and
        turning dedup on or off later leaves every page where a rank's own store finds it."""
        from ..engine.store import L3Store

        if plan.writers.me < 0:
            raise AttachError(f"host-dedup source TP rank {plan.topology.tp_rank} is not a writer of its node "
                              f"({list(plan.writers.writers)})")
        stores = {plan.writers.me: store}
        try:
            for i, tp in enumerate(plan.writers.writers):
                if i not in stores:
                    stores[i] = L3Store.open(self.config, rank=plan.topology.local_rank_of(tp),
                                             namespace=plan.namespace.to_namespace(), page_bytes=plan.page_bytes())
        except BaseException:
            for other in stores.values():
                other.close()
            raise
        return stores

    def _attach_peer(self, dedup: dict) -> None:
        """A host-dedup peer: every registered pool must be allocator-only (what it would claim loaded, it must not
        hold); no store, no disk, no index."""
        real = [n for n, p in self.pools.items() if not sglang_pools.allocator_only(p)]
        if real:
            raise AttachError(f"sglang-glm-ext L3 backend cannot attach as a host-dedup peer: host pools {real} hold "
                              "bytes, which a peer would never read or write")
        self._peer = dedup
        self._path = _PeerPath(self.c)
        logger.info("sglang-glm-ext L3 backend attached as a host-dedup peer of TP rank %s (group %s): no store, no "
                    "reads, no writes", dedup.get("source_tp_rank"), dedup.get("group"))

    def _serve_late(self, name: str, pool) -> None:
        """A sidecar draft pool registered after the store opened: its own record, its kind added to the store,
        then a new plan that holds it (the data path sees the pool only once everything it needs is in place)."""
        try:
            record = plan_late_pool(self.config, name, pool, self.pools[KV])
            for st in {id(x): x for x in (self._store, *self._writer_stores.values())}.values():
                st.add_kind(record.kind, record.page_bytes)
        except (AttachError, LayoutRefused, L3ConfigError, L3StoreError) as exc:
            raise AttachError(f"sglang-glm-ext L3 backend cannot serve host pool {name!r} registered after the "
                              f"store opened: {exc}") from exc
        self.plan = self.plan.with_pool(record)
        logger.info("sglang-glm-ext L3 backend: late host pool %r served as %s (%s/%dB)", name, record.kind.label,
                    record.plan.fmt.layout, record.page_bytes)

    # ------------------------------------------------------------------ run: the one guard and error net
    def _run(self, n: int, miss: Callable[[int], Any], fn: Callable, *args):
        """``fn(data_path, plan, *args)``, or ``miss(n)`` when not attached (counted ``not_ready``) or when it
        raised (counted ``errors``; the traceback logged at most once a minute)."""
        path, plan = self._path, self.plan if self.plan is not None else _NO_PLAN
        if path is None or self._closed:
            self.c.not_ready += n
            return miss(n)
        try:
            return fn(path, plan, *args)
        except Exception:  # noqa: BLE001 - never into the scheduler
            self.c.errors += 1
            now = time.monotonic()
            if now - self._last_log >= _LOG_EVERY_S:
                self._last_log = now
                logger.exception("sglang-glm-ext L3: a storage call of %d pages failed (misses / dropped writes; "
                                 "%d such failures so far)", n, self.c.errors)
            return miss(n)

    # ------------------------------------------------------------------ v1: KV pages, zero-copy
    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        return self._run(_count(keys), _misses, lambda p, plan: p.spill(plan.kv, keys, host_indices))

    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        return self._run(_count(keys), _misses, lambda p, plan: p.reload(plan.kv, keys, host_indices))

    def batch_exists(self, keys: List[str], extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        if not keys:
            return 0
        return self._run(0, lambda n: 0, lambda p, plan: p.exists(plan.pools, keys)[0])

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    # ------------------------------------------------------------------ v2: pools beside the KV, same batch
    def batch_exists_v2(self, keys: List[str], pool_transfers: Optional[List[PoolTransfer]] = None,
                        extra_info: Optional[HiCacheStorageExtraInfo] = None) -> PoolTransferResult:
        if not keys:
            return PoolTransferResult.empty()
        got = self._run(0, lambda n: None, lambda p, plan: p.exists(plan.pools, keys, pool_transfers))
        return PoolTransferResult.empty() if got is None else PoolTransferResult(got[0], got[1],
                                                                                 list(range(1, got[0] + 1)))

    def batch_get_v2(self, transfers: List[PoolTransfer],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> dict:
        return self._transfers(transfers, "reload")

    def batch_set_v2(self, transfers: List[PoolTransfer],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> dict:
        return self._transfers(transfers, "spill")

    def _transfers(self, transfers, op: str) -> dict:
        # Each transfer through the net on its own: a malformed one costs only its own pool's pages.
        return {getattr(t, "name", None): self._run(_count(getattr(t, "keys", None) or ()), _misses,
                                                    lambda p, plan, t=t: p.transfer(plan.pools, t, getattr(p, op)))
                for t in (transfers or ())}

    # ------------------------------------------------------------------ generic (flat pages) path
    def get(self, key: str, target_location: Optional[Any] = None, target_sizes: Optional[Any] = None):
        got = self.batch_get([key], [target_location])
        return got[0] if got else None

    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> List[torch.Tensor | None]:
        if target_locations is None:
            return _nones(_count(keys))
        return self._run(_count(keys), _nones, lambda p, plan: p.get_flat(plan.kv, keys, list(target_locations)))

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        return self.batch_set([key], [value])

    def batch_set(self, keys: List[str], values: Optional[Any] = None, target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        if values is None:
            return False
        return self._run(_count(keys), lambda n: False, lambda p, plan: p.set_flat(plan.kv, keys, list(values)))

    # ------------------------------------------------------------------ control
    def clear(self) -> bool:
        """SGLang's clear_storage_backend / flush_cache: drop this rank's pages (every attacher of this store
        shares them, as they share the disk)."""
        return self._run(0, lambda n: False,
                         lambda p, plan: all([bool(st.clear()) for st in self._own_stores()]))

    def close(self) -> None:
        """Detach / shutdown: close this attach's handle; the last handle of the process's store flushes and
        closes it, which releases its slab, owner and index locks."""
        if self._closed:
            return
        self._closed = True
        self._path = None
        metrics.detach(self._metrics)  # its final push reads the store: before the handle closes
        self._metrics = None
        stores = self._own_stores()
        self._store, self._writer_stores = None, {}
        for store in stores:
            try:
                store.close()
            except Exception:  # noqa: BLE001 - shutdown goes on; the store logged what failed
                logger.exception("sglang-glm-ext L3: closing the store failed")

    def _own_stores(self) -> list:
        """This attach's store, then the other writers' stores a host-dedup source opened, each once."""
        return list({id(x): x for x in (self._store, *self._writer_stores.values()) if x is not None}.values())

    def get_stats(self):
        """SGLang's StorageMetrics since the last call (scheduler thread, every tick) in O(1): swaps in fresh sample
        lists and hands the old ones over, no copy, no store call; None (SGLang's "nothing") if that fails."""
        try:
            from sglang.srt.observability.metrics_collector import StorageMetrics

            m = self._samples.take()
            return StorageMetrics(prefetch_pgs=m["prefetch_pgs"], backup_pgs=m["backup_pgs"],
                                  prefetch_bandwidth=m["prefetch_bandwidth"], backup_bandwidth=m["backup_bandwidth"])
        except Exception:  # noqa: BLE001 - never into the scheduler
            self.c.errors += 1
            return None

    # ------------------------------------------------------------------ diagnostics
    @property
    def store(self):
        """This attach's L3Store handle (None before the attach and after close)."""
        return self._store

    @property
    def stores(self) -> tuple:
        """Every store this attach writes: its own, then (a host-dedup source) the other writers' it opened."""
        return tuple(self._own_stores())

    def other_writer_stores(self) -> list:
        """(writer TP rank, store) of each store a host-dedup source writes besides its own (metrics export them)."""
        if self.plan is None:
            return []
        return [(self.plan.writers.writers[i], st) for i, st in sorted(self._writer_stores.items())
                if st is not self._store]

    @property
    def rank(self) -> int | None:
        return None if self.plan is None else self.plan.rank

    @property
    def namespace(self):
        return None if self.plan is None else self.plan.namespace

    @property
    def writers(self):
        return None if self.plan is None else self.plan.writers

    @property
    def topology(self):
        return None if self.plan is None else self.plan.topology

    def l3_stats(self) -> dict:
        """Backend counters plus the engine's (doctor, tests, the metrics)."""
        plan, store = self.plan, self._store
        out = {"backend": self.c.as_dict(), "rank": self.rank, "ready": self._path is not None,
               "cp_rank": self.cp_rank, "cp_size": self.cp_size}
        dedup = (self.storage_config.extra_config or {}).get(DEDUP_KEY)
        if dedup:
            out["host_dedup"] = dict(dedup)
            if len(self._own_stores()) > 1:  # a source's writes into the other writers' stores
                out["host_dedup"]["writer_stores"] = {st.rank: {k: st.stats()[k] for k in ("spilled", "spill_accepted")}
                                                      for st in self._own_stores()}
        if plan is not None:
            w = plan.writers
            out["writers"] = {"mode": w.mode, "tp_ranks": list(w.writers), "me": w.me}
            out["namespace"] = plan.namespace.describe()
        if store is not None:
            out["store"] = store.stats()
            out["store_refs"] = store.shared.refs
        return out
