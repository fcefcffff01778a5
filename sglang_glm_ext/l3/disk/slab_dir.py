"""A rank's slab directory: ``<disk>/<deployment>/rank<r>/<kind>.slab`` and each slab's JSON sidecar.

One slab per (kind, slot size): ``<kind>.slab`` is the first; a slab of another slot size under the same deployment
and rank (a model with another page size: an upgrade, or two models taking turns) gets its own file beside it,
``<kind>.s<slot_bytes>.slab``. :func:`slab_path_for` is the one rule that names the file of a
(kind, slot size), for the owner and for every reader; :func:`kind_slabs` lists a kind's files.

The sidecar (``<slab>.meta.json``, written by the owner at open) records what the slab file cannot say about itself:
slot size, slot count, page bytes, deployment and rank, and ``namespaces``: the digests of every namespace that has
owned the slab (the latest last). An index entry names (rank, disk, slot), not a file, so when a kind has several
slabs the namespace of the entry's key says which slab it is in. fsck and tools read it to open slabs they do not
own; the owner reads it to refuse a directory that resolves to another deployment's files.
"""

from __future__ import annotations

import glob
import json
import os
import re

from ..config import L3Config
from ..errors import L3StoreError
from .format import PayloadKind
from .fsutil import fsync_dir

__all__ = ["slab_path", "slab_path_for", "kind_slabs", "slab_namespaces", "read_slab_meta", "write_slab_meta",
           "check_slab_owner", "remove_slab", "NAMESPACES_KEPT"]

NAMESPACES_KEPT = 32  # a sidecar remembers this many namespaces (the latest); older ones' entries map by elimination


def slab_path(config: L3Config, rank: int, kind: PayloadKind, disk: int | None = None) -> str:
    """The first slab of a kind (``<kind>.slab``)."""
    return os.path.join(config.slab_dir(rank, disk), f"{kind.label}.slab")


def _meta_slot_bytes(path: str) -> "int | None":
    meta = read_slab_meta(path)
    v = meta.get("slot_bytes") if isinstance(meta, dict) else None
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def slab_path_for(config: L3Config, rank: int, kind: PayloadKind, slot_bytes: int, disk: int | None = None) -> str:
    """The slab file of (kind, slot size): ``<kind>.slab`` if that file is of this slot size (or has no sidecar to
    say otherwise: a slab whose creation never finished holds no committed page), else ``<kind>.s<slot_bytes>.slab``
    if it exists, else ``<kind>.slab`` if there is none yet, else ``<kind>.s<slot_bytes>.slab`` (a new file beside
    a slab of another slot size)."""
    first = slab_path(config, rank, kind, disk)
    beside = os.path.join(config.slab_dir(rank, disk), f"{kind.label}.s{slot_bytes}.slab")
    if os.path.exists(first):
        sb = _meta_slot_bytes(first)
        if sb is None or sb == slot_bytes:
            return first
        return beside
    return first if not os.path.exists(beside) else beside


_BESIDE = re.compile(r"\.s(\d+)\.slab$")


def kind_slabs(config: L3Config, rank: int, kind: PayloadKind, disk: int | None = None) -> list[str]:
    """Every slab file of a kind in the rank's directory (the first one first)."""
    d = config.slab_dir(rank, disk)
    out = [p for p in [slab_path(config, rank, kind, disk)] if os.path.exists(p)]
    out += sorted(p for p in glob.glob(os.path.join(glob.escape(d), f"{kind.label}.s*.slab"))
                  if _BESIDE.search(p))
    return out


def slab_namespaces(meta: "dict | None") -> set[bytes]:
    """The namespace digests a sidecar says have owned its slab (older sidecars name only the last)."""
    out: set[bytes] = set()
    if not isinstance(meta, dict):
        return out
    for v in [*(meta.get("namespaces") or []), meta.get("ns_digest")]:
        try:
            out.add(bytes.fromhex(v))
        except (TypeError, ValueError):
            pass
    return out


def remove_slab(path: str) -> None:
    """Delete a slab and its sidecar (the slab first: a sidecar without its slab is harmless), durably."""
    for p in (path, path + ".meta.json"):
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass
    fsync_dir(os.path.dirname(path))


def read_slab_meta(path: str) -> dict | None:
    """The JSON sidecar (``<slab>.meta.json``) the owner writes at open: slot size and count for readers / fsck.
    None where there is none, or it is not a JSON object (a hand edit, a damaged file: every reader treats it as
    absent instead of failing on ``.get``)."""
    try:
        with open(path + ".meta.json", "r") as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


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
