"""The backend's run: SGLang's storage calls carried out against one attach's store, with nothing left to decide.

Each operation takes the :class:`~.plan.PoolRecord` of the pool it serves (where the pages are, the payload kind,
the key tag), maps SGLang's keys and host indices onto it and hands the pages to the store in one call. It does not
catch: the backend's adapter (``backend.py``) runs every call through its one guard and error net, and the store's
caller API never raises either (a page's own failure is that page's miss). What is counted here is only what the
store cannot know: pages refused before the store (bad host indices, an unknown pool) and, under CP, the pages
another replica owns (acknowledged as that owner's: it writes the same bytes, and if it fails they are a miss for
every rank, never a hang, never other bytes). Hits, misses, accepted and dropped pages are the store's counters.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from .cp_writers import WriterPlan
from .keys import pool_keys, storage_key, storage_keys
from .plan import PoolRecord

__all__ = ["BackendCounters", "Samples", "DataPath", "indices_np"]

_SAMPLES = 1024  # per get_stats() interval; older samples of a long interval are dropped, never grow memory


class BackendCounters:
    """What the backend refuses or absorbs before the store (the store counts the pages it handles)."""

    __slots__ = ("set_not_owned", "exists_calls", "bad_indices", "unknown_pool", "errors", "not_ready")

    def __init__(self):
        for name in self.__slots__:
            setattr(self, name, 0)

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__slots__}


class Samples:
    """SGLang's ``StorageMetrics`` samples (pages and GB/s per backup / prefetch call) since its last ``get_stats``:
    plain lists, each capped at ``_SAMPLES`` per interval, handed over whole by :meth:`take` (no copy)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._m = self._new()

    @staticmethod
    def _new() -> dict:
        return {k: [] for k in ("prefetch_pgs", "backup_pgs", "prefetch_bandwidth", "backup_bandwidth")}

    def add(self, op: str, pages: int, nbytes: int, seconds: float) -> None:
        # An I/O thread that took the old dict just before a swap may add one sample to a list the collector is
        # iterating: a list iterator tolerates that.
        m = self._m
        pgs = m[f"{op}_pgs"]
        if len(pgs) < _SAMPLES:
            pgs.append(pages)
            if seconds > 0:
                m[f"{op}_bandwidth"].append(nbytes / seconds / 1e9)

    def take(self) -> dict:
        with self._lock:
            m, self._m = self._m, self._new()
        return m


def indices_np(host_indices) -> np.ndarray:
    if isinstance(host_indices, torch.Tensor):
        t = host_indices.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        return t.reshape(-1).numpy().astype(np.int64, copy=False)
    return np.asarray(host_indices, dtype=np.int64).reshape(-1)


class DataPath:
    """One attach's data path: its store handle, its writer plan and what SGLang's ``batch_set`` waits for
    (staging room up to ``wait`` s; with ``durable`` the pages' durability too).

    ``stores``: the store each writer this process writes for (writer index -> store); by default this rank's own.
    A host-dedup source holds the only copy of its node's pages, so it writes every writer's share into that
    writer's store (its slabs, its disks), keeping the node's L3 spread over every rank's disks as without dedup;
    reads and lookups go through this rank's store, which reads any rank's slab the shared index names."""

    def __init__(self, store, writers: WriterPlan, counters: BackendCounters, samples: Samples, *, wait: float,
                 durable: bool, stores: "Mapping[int, Any] | None" = None):
        self.store = store
        self.writers = writers
        self.stores = dict(stores) if stores else ({writers.me: store} if writers.me >= 0 else {})
        self.c = counters
        self.samples = samples
        self.wait = wait
        self.durable = durable

    # ------------------------------------------------------------------ host pages (v1 and v2)
    def spill(self, rec: PoolRecord, keys: Sequence, host_indices) -> list[bool]:
        n = len(keys)
        pages = self._pages(rec, host_indices, n)
        if pages is None:
            return [False] * n
        raw = storage_keys(keys)

        def write(store, mine: list[int]) -> list[bool]:
            return store.spill_from_layout(rec.kind, pool_keys([raw[i] for i in mine], rec.tag), rec.plan.layout,
                                           [pages[i] for i in mine], wait=self.wait, durable=self.durable)

        return self._spill_owned(rec, raw, write)

    def reload(self, rec: PoolRecord, keys: Sequence, host_indices) -> list[bool]:
        n = len(keys)
        pages = self._pages(rec, host_indices, n)
        if pages is None:
            return [False] * n
        t0 = time.perf_counter()
        ok = self.store.reload_into_layout(rec.kind, pool_keys(storage_keys(keys), rec.tag), rec.plan.layout, pages)
        hits = sum(ok)
        self.samples.add("prefetch", hits, hits * rec.page_bytes, time.perf_counter() - t0)
        return ok

    def exists(self, pools: Mapping[str, PoolRecord], keys: Sequence, transfers=()) -> tuple[int, dict]:
        """(pages at the start of ``keys`` that every asked pool holds, {pool name: its own leading run}): pages
        durable or staged, visible as soon as batch_set returned. The KV pool always, then each v2 transfer's pool
        over the KV run; an unknown pool or another hit policy than ALL_PAGES ends the run (0 pages)."""
        from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy

        self.c.exists_calls += 1
        skeys = storage_keys(keys)
        final = self._leading(pools["kv"], skeys)
        hits: dict = {"kv": final} if final else {}
        for transfer in transfers or ():
            if not final:
                break
            rec = pools.get(_name(transfer.name))
            if rec is None or transfer.hit_policy != PoolHitPolicy.ALL_PAGES:
                self.c.unknown_pool += 1
                return 0, hits
            boundary = self._leading(rec, skeys[:final])
            if boundary:
                hits[transfer.name] = boundary
            final = min(final, boundary)
        return final, hits

    def _leading(self, rec: PoolRecord, skeys: list) -> int:
        return self.store.exists(rec.kind, pool_keys(skeys, rec.tag))

    def transfer(self, pools: Mapping[str, PoolRecord], transfer, op: Callable) -> list[bool]:
        """One v2 ``PoolTransfer`` (its pool's pages, in the same batch as the KV pages): ``op`` is :meth:`spill`
        or :meth:`reload`."""
        keys = list(transfer.keys or [])
        rec = pools.get(_name(transfer.name))
        if rec is None:
            self.c.unknown_pool += 1
            return [False] * len(keys)
        if transfer.host_indices is None:
            self.c.bad_indices += len(keys)
            return [False] * len(keys)
        return op(rec, keys, transfer.host_indices)

    # ------------------------------------------------------------------ flat pages (SGLang's generic get / set)
    def get_flat(self, rec: PoolRecord, keys: Sequence, targets: Sequence) -> list:
        """SGLang's flat page (``get_data_page``) has the v1 payload's byte order for every served layout, so both
        paths read each other's pages. Returns each target that now holds its page, else None."""
        n = len(keys)
        dsts = [_flat(t, rec.page_bytes) for t in targets]
        out: list = [None] * n
        todo = [i for i in range(n) if dsts[i] is not None]
        self.c.bad_indices += n - len(todo)
        if todo:
            ok = self.store.reload_into(rec.kind, [storage_key(keys[i]) for i in todo], [dsts[i] for i in todo])
            for i, hit in zip(todo, ok):
                if hit:
                    out[i] = targets[i]
        return out

    def set_flat(self, rec: PoolRecord, keys: Sequence, values: Sequence) -> bool:
        pages = [_flat(v, rec.page_bytes) for v in values]
        if any(p is None for p in pages):
            self.c.bad_indices += len(keys)
            return False
        return all(self._spill_owned(rec, storage_keys(keys), lambda store, mine: store.spill(
            rec.kind, [storage_key(keys[i]) for i in mine], [pages[i] for i in mine], wait=self.wait,
            durable=self.durable)))

    # ------------------------------------------------------------------ shared steps
    def _pages(self, rec: PoolRecord, host_indices, n: int) -> "list[int] | None":
        pages = rec.plan.pages(indices_np(host_indices), n) if n else []
        if pages is None:
            self.c.bad_indices += n
        return pages

    def _spill_owned(self, rec: PoolRecord, raw: list, write: Callable[[Any, list[int]], list[bool]]) -> list[bool]:
        """Write the pages this process writes (``write`` takes a store and their positions), each into its writer's
        store; acknowledge the others as their owner's, and with ``ack = "durable"`` only once the owner committed
        them (the shared index)."""
        n = len(raw)
        if not n:
            return []
        owners = self.writers.owner_indices(raw)
        by_store: dict[int, list[int]] = {}
        others = []
        for i, o in enumerate(owners):
            (by_store.setdefault(o, []) if o in self.stores else others).append(i)
        self.c.set_not_owned += len(others)
        out = [True] * n
        t0 = time.perf_counter()
        accepted = 0
        for o, mine in by_store.items():
            ok = write(self.stores[o], mine)
            accepted += sum(ok)
            for i, hit in zip(mine, ok):
                out[i] = bool(hit)
        if by_store:
            self.samples.add("backup", accepted, accepted * rec.page_bytes, time.perf_counter() - t0)
        if others and self.durable:
            left = max(0.0, self.wait - (time.perf_counter() - t0))
            got = self.store.wait_durable(rec.kind, pool_keys([raw[i] for i in others], rec.tag), left)
            for i, hit in zip(others, got):
                out[i] = bool(hit)
        return out


def _name(name) -> str:
    value = getattr(name, "value", name)
    return value if isinstance(value, str) else str(value)


def _flat(tensor: Any, page_bytes: int) -> "np.ndarray | None":
    if tensor is None or not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu":
        return None
    if not tensor.is_contiguous() or tensor.nbytes != page_bytes:
        return None
    return tensor.view(-1).view(torch.uint8).numpy()
