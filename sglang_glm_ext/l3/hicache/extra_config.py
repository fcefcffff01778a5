"""The extra config SGLang's ``dynamic`` factory hands the backend (:func:`build` writes it at launch,
:func:`parse` checks it at attach), and the backend's attach error. Pure: no SGLang.

What SGLang expects of a backend beyond that lives in the store now: a page is visible to ``exists`` / ``get`` as
soon as ``batch_set`` returns (``L3Store`` serves staged pages), and one store per (config, rank) per process is
shared by every controller that attaches (``L3Store.open`` hands out counted handles).
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

__all__ = ["BACKEND_NAME", "MODULE_PATH", "CLASS_NAME", "SGLANG_CONTROLLER_KEYS", "ALL_REPLICAS_WRITE_ATTR",
           "SYNC_GROUPS_KEY", "build", "parse", "config_digest", "digest_of", "AttachError", "dump_json"]

BACKEND_NAME = "sglang_glm_ext.l3"
MODULE_PATH = "sglang_glm_ext.l3.hicache.backend"
CLASS_NAME = "L3HiCacheStorage"
# Keys SGLang's controller pops from the extra config itself (hybrid_cache_controller.py
# parse_storage_backend_extra_config, cache_controller.py _generate_storage_config); a user may pass them.
# Set (True) on a storage config the l3.cp_storage_writers patch rewrote: SGLang calls batch_set on every replica.
ALL_REPLICAS_WRITE_ATTR = "l3_all_replicas_write"
# Set by the l3.storage_kv_dtype hook: the global ranks of each group the controller's storage MIN agreements reduce
# over (the groups _create_sync_groups builds from), for the attach check of a rank's part group (parts.uncovered).
SYNC_GROUPS_KEY = "sync_group_ranks"
SGLANG_CONTROLLER_KEYS = ("prefetch_threshold", "prefetch_timeout_base", "prefetch_timeout_per_ki_token",
                          "hicache_storage_pass_prefix_keys")


class AttachError(RuntimeError):
    """The backend cannot attach as configured (raised from on_host_pools_registered: SGLang fails the attach)."""


def config_digest(path: str) -> str:
    with open(path, "rb") as f:
        return digest_of(f.read())


def digest_of(raw: bytes) -> str:
    """A config's digest, from its bytes (what ``l3_config_sha256`` holds)."""
    return hashlib.sha256(raw).hexdigest()[:16]


def build(config_path: str, user_extra: dict | None = None, *, digest: str | None = None) -> dict:
    """The ``--hicache-storage-backend-extra-config`` object that makes SGLang's ``dynamic`` factory build the
    L3 backend, with zero-copy v1 I/O (``interface_v1``). ``user_extra`` may carry SGLang's own controller keys.
    ``digest``: the config's, from the bytes the caller parsed (the launch plan), so the file is not read again."""
    path = os.path.abspath(config_path)
    out: dict[str, Any] = {
        "backend_name": BACKEND_NAME,
        "module_path": MODULE_PATH,
        "class_name": CLASS_NAME,
        "interface_v1": 1,
        "l3_config": path,
        "l3_config_sha256": digest or config_digest(path),
    }
    for k, v in (user_extra or {}).items():
        if k not in SGLANG_CONTROLLER_KEYS:
            raise ValueError(
                f"--hicache-storage-backend-extra-config key {k!r} cannot be combined with --enable-cp-l3 "
                f"(the plugin writes the backend's extra config; allowed: {', '.join(SGLANG_CONTROLLER_KEYS)})")
        out[k] = v
    return out


def parse(extra: dict | None) -> dict:
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


def dump_json(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))
