"""What the backend needs around ``L3Store`` that SGLang expects and the store does not offer. Pure: no SGLang.

* One store per (config, rank) per process, shared by every controller that attaches (:class:`StoreRegistry`).
  A second ``L3Store.open`` of the same slabs raises ``SlabLockedError``, and a second store's cold start or
  ``clear`` would drop the first one's pages; so attaches share one refcounted store, and the last detach closes it.
* A page visible to ``exists`` / ``get`` as soon as ``batch_set`` returns (:class:`PendingPages`). ``L3Store.spill``
  returns once the page is staged; ``exists`` counts it only once durable. The backend remembers what it spilled
  until the store's writer has drained past it, counts those pages present, and a read of one waits (bounded)
  until it is durable. The store-side fix (serve staged pages) is store need N1 in ``docs_internal/l3_hicache.md``.
* The extra config SGLang's ``dynamic`` factory gets (:func:`extra_config` / :func:`parse_extra_config`).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["BACKEND_NAME", "MODULE_PATH", "CLASS_NAME", "SGLANG_CONTROLLER_KEYS", "extra_config",
           "parse_extra_config", "config_digest", "StoreRegistry", "SharedStore", "PendingPages", "REGISTRY",
           "AttachError"]

BACKEND_NAME = "sglang_glm_ext.l3"
MODULE_PATH = "sglang_glm_ext.l3.hicache.backend"
CLASS_NAME = "L3HiCacheStorage"
# Keys SGLang's controller pops from the extra config itself (hybrid_cache_controller.py
# parse_storage_backend_extra_config, cache_controller.py _generate_storage_config); a user may pass them.
SGLANG_CONTROLLER_KEYS = ("prefetch_threshold", "prefetch_timeout_base", "prefetch_timeout_per_ki_token",
                          "hicache_storage_pass_prefix_keys")


class AttachError(RuntimeError):
    """The backend cannot attach as configured (raised from on_host_pools_registered: SGLang fails the attach)."""


def config_digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


def extra_config(config_path: str, user_extra: dict | None = None) -> dict:
    """The ``--hicache-storage-backend-extra-config`` object that makes SGLang's ``dynamic`` factory build the
    L3 backend, with zero-copy v1 I/O (``interface_v1``). ``user_extra`` may carry SGLang's own controller keys."""
    path = os.path.abspath(config_path)
    out: dict[str, Any] = {
        "backend_name": BACKEND_NAME,
        "module_path": MODULE_PATH,
        "class_name": CLASS_NAME,
        "interface_v1": 1,
        "l3_config": path,
        "l3_config_sha256": config_digest(path),
    }
    for k, v in (user_extra or {}).items():
        if k not in SGLANG_CONTROLLER_KEYS:
            raise ValueError(
                f"--hicache-storage-backend-extra-config key {k!r} cannot be combined with --enable-cp-l3 "
                f"(the plugin writes the backend's extra config; allowed: {', '.join(SGLANG_CONTROLLER_KEYS)})")
        out[k] = v
    return out


def parse_extra_config(extra: dict | None) -> dict:
    """Check the extra config the backend was built with; returns it. AttachError names what is wrong."""
    if not isinstance(extra, dict) or extra.get("backend_name") != BACKEND_NAME:
        raise AttachError("the L3 backend was built without the plugin's extra config; launch with "
                          "--enable-cp-l3 --cp-l3-config PATH instead of naming the class by hand")
    path = extra.get("l3_config")
    if not isinstance(path, str) or not os.path.isfile(path):
        raise AttachError(f"L3 config {path!r} (from --cp-l3-config) is not readable in this process")
    want = extra.get("l3_config_sha256")
    if want and config_digest(path) != want:
        raise AttachError(f"L3 config {path} changed after launch (digest {config_digest(path)}, launch saw "
                          f"{want}); every rank must read the same config: restart the server")
    return extra


# ---------------------------------------------------------------------------------------------- pending pages
class PendingPages:
    """Pages accepted by ``spill`` and not yet known durable, per payload kind, oldest first.

    Invariant: a key is here only while the store may still make it durable, and the set stays bounded by what is
    in flight. Entries are stamped (generation, time). When the store reports nothing in flight
    (``inflight() == 0``), every entry stamped before that check is resolved (durable or dropped) and is forgotten;
    under steady traffic, where the store is never idle, each prune forgets the oldest entries that are durable
    (one ``exists`` call over at most ``PRUNE_BATCH`` keys per kind) and any older than ``max_age_s`` (a write the
    store dropped). ``wait_durable`` bounds a reader's wait.
    """

    PRUNE_BATCH = 256

    def __init__(self, inflight: Callable[[], int], durable: Callable[[Any, list], int], max_wait_s: float = 10.0,
                 max_age_s: float = 60.0):
        self._inflight = inflight
        self._durable = durable  # (kind, keys) -> length of the durable prefix
        self._lock = threading.Lock()
        self._gen = 0
        self._keys: dict[Any, dict[bytes, tuple[int, float]]] = {}
        self.max_wait_s = max_wait_s
        self.max_age_s = max_age_s
        self.waited = 0  # reads that had to wait for durability (counted, for stats)

    def add(self, kind, keys: list[bytes], accepted: list[bool]) -> None:
        now = time.monotonic()
        with self._lock:
            self._gen += 1
            stamp = (self._gen, now)
            d = self._keys.setdefault(kind, {})
            for k, ok in zip(keys, accepted):
                if ok:
                    d.pop(k, None)  # re-spilled: move to the young end
                    d[k] = stamp

    def __len__(self) -> int:
        with self._lock:
            return sum(len(d) for d in self._keys.values())

    def prune(self) -> None:
        """Forget entries the store has resolved. O(1) when nothing is pending; bounded work otherwise."""
        with self._lock:
            if not any(self._keys.values()):
                return
            gen = self._gen
        if self._inflight() == 0:
            with self._lock:
                for d in self._keys.values():
                    for k in [k for k, (g, _) in d.items() if g <= gen]:
                        del d[k]
            return
        now = time.monotonic()
        for kind in list(self._keys):
            with self._lock:
                d = self._keys.get(kind) or {}
                oldest = list(itertools.islice(d.items(), self.PRUNE_BATCH))
            if not oldest:
                continue
            durable = self._durable(kind, [k for k, _ in oldest])
            with self._lock:
                for i, (k, stamp) in enumerate(oldest):
                    if i >= durable and now - stamp[1] <= self.max_age_s:
                        break
                    if d.get(k) == stamp:
                        del d[k]

    def which(self, kind, keys: list[bytes]) -> list[bool] | None:
        """Per key, whether it is pending; None (no per-key work) when nothing of ``kind`` is."""
        d = self._keys.get(kind)
        if not d:
            return None
        return [k in d for k in keys]

    def contains(self, kind, key: bytes) -> bool:
        d = self._keys.get(kind)
        return bool(d) and key in d

    def forget(self, kind=None) -> None:
        with self._lock:
            if kind is None:
                self._keys.clear()
            else:
                self._keys.pop(kind, None)

    def wait_durable(self, kind, key: bytes) -> bool:
        """Wait until ``key`` is durable (True) or resolved without being durable / timed out (False)."""
        deadline = time.monotonic() + self.max_wait_s
        delay = 0.0005
        self.waited += 1
        while True:
            if self._durable(kind, [key]):
                return True
            if not self.contains(kind, key):  # resolved: durable just now, or dropped
                return bool(self._durable(kind, [key]))
            if time.monotonic() >= deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.01)
            self.prune()


# ---------------------------------------------------------------------------------------------- registry
@dataclass
class SharedStore:
    """A store and what every attached backend of this (config, rank) shares with it."""

    key: tuple
    store: Any
    namespace_digest: bytes
    page_bytes: dict
    pending: PendingPages
    refs: int = 0
    served_calls: int = 0
    holders: list = field(default_factory=list)


class StoreRegistry:
    """One open store per (deployment, index, disks, rank) in this process; refcounted."""

    def __init__(self):
        self._lock = threading.Lock()
        self._stores: dict[tuple, SharedStore] = {}

    @staticmethod
    def key_for(config, rank: int) -> tuple:
        return (config.deployment_id, os.path.realpath(config.index_path),
                tuple(os.path.realpath(d.path) for d in config.disks), rank)

    def acquire(self, config, rank: int, namespace, page_bytes: dict, opener: Callable[[], Any],
                holder: Any = None) -> SharedStore:
        """The shared store for (config, rank), opened with ``opener()`` on first use. A later attach must ask
        for the same namespace and payload kinds, else AttachError (one namespace per deployment and rank)."""
        key = self.key_for(config, rank)
        digest = namespace.digest()
        with self._lock:
            shared = self._stores.get(key)
            if shared is not None:
                if shared.namespace_digest != digest or shared.page_bytes != dict(page_bytes):
                    raise AttachError(
                        f"L3 deployment {config.deployment_id!r} rank {rank} is already attached in this process "
                        f"with another page format (namespace {shared.namespace_digest.hex()} vs {digest.hex()}, "
                        f"payloads {shared.page_bytes} vs {dict(page_bytes)}); a deployment and rank serve one "
                        "format at a time: give the second cache its own deployment_id")
                if shared.store.config != config:
                    raise AttachError(
                        f"L3 deployment {config.deployment_id!r} rank {rank} is already open in this process "
                        f"from another config ({shared.store.config.source}); attach with the same config")
            else:
                store = opener()
                from ..store import L3Store  # noqa: F401  (type only)

                shared = SharedStore(
                    key, store, digest, dict(page_bytes),
                    PendingPages(inflight=lambda s=store: s.stats()["inflight"],
                                 durable=lambda kind, keys, s=store: s.exists(kind, keys)),
                )
                self._stores[key] = shared
            shared.refs += 1
            shared.holders.append(holder)
            return shared

    def release(self, shared: SharedStore, holder: Any = None, timeout: float = 30.0) -> bool:
        """Drop one reference; the last one closes the store (flushing what is staged). True if closed."""
        with self._lock:
            if shared.refs <= 0:
                return False
            shared.refs -= 1
            if holder in shared.holders:
                shared.holders.remove(holder)
            if shared.refs:
                return False
            self._stores.pop(shared.key, None)
        shared.pending.forget()
        shared.store.close(timeout)
        return True

    def open_stores(self) -> list[SharedStore]:
        with self._lock:
            return list(self._stores.values())


REGISTRY = StoreRegistry()


def dump_json(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))
