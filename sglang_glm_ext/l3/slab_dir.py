"""A rank's slab directory: ``<disk>/<deployment>/rank<r>/<kind>.slab`` and each slab's JSON sidecar.

The sidecar (``<kind>.slab.meta.json``, written by the owner at open) records what the slab file cannot say about
itself: slot size, slot count, page bytes, deployment and rank. fsck and tools read it to open slabs they do not
own; the owner reads it to refuse a directory that resolves to another deployment's files.
"""

from __future__ import annotations

import json
import os

from .config import L3Config
from .errors import L3StoreError
from .format import PayloadKind
from .fsutil import fsync_dir

__all__ = ["slab_path", "read_slab_meta", "write_slab_meta", "check_slab_owner"]


def slab_path(config: L3Config, rank: int, kind: PayloadKind, disk: int | None = None) -> str:
    return os.path.join(config.slab_dir(rank, disk), f"{kind.label}.slab")


def read_slab_meta(path: str) -> dict | None:
    """The JSON sidecar (``<slab>.meta.json``) the owner writes at open: slot size and count for readers / fsck."""
    try:
        with open(path + ".meta.json", "r") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_slab_meta(path: str, meta: dict) -> None:
    """Replace the sidecar atomically; the rename, and a slab file created just before, are durable on return."""
    tmp = path + ".meta.json.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(meta, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path + ".meta.json")
    fsync_dir(os.path.dirname(path))


def check_slab_owner(path: str, deployment_id: str, rank: int) -> None:
    """Refuse a slab whose sidecar names another deployment or rank: its directory resolves to someone else's
    (a symlink or bind mount). The digest check would keep the bytes apart anyway; this makes the set-up loud."""
    meta = read_slab_meta(path)
    if not isinstance(meta, dict):
        return
    owner, owner_rank = meta.get("deployment_id"), meta.get("rank")
    if (owner is not None and owner != deployment_id) or (owner_rank is not None and owner_rank != rank):
        raise L3StoreError(
            f"L3 slab {path} belongs to deployment {owner!r} rank {owner_rank} (its sidecar says so), not to "
            f"deployment {deployment_id!r} rank {rank}: two deployments' directories resolve to the same files "
            f"(a symlink or bind mount?). Give each deployment a directory of its own.")
