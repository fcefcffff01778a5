"""The L3 backend's part of ``sglang-glm-ext doctor``: the backend class SGLang will build, the extra config the
flag hook resolves to, and the L3 state on disk (index entries of this deployment, slabs per rank).

Read-only: the index is opened read-only (LMDB allows it next to a running server), slabs are only stat'ed and
their JSON sidecars read.
"""

from __future__ import annotations

import os
from typing import Any

from ...declare import PluginFlagError
from ..feature import CP_L3_CONFIG, ENABLE_CP_L3
from . import attach

__all__ = ["report", "render"]


def _index_state(cfg) -> dict:
    from ..index import L3Index, deployment_tag

    out: dict[str, Any] = {"path": cfg.index_path, "exists": os.path.isfile(os.path.join(cfg.index_path, "data.mdb"))}
    if not out["exists"]:
        return out
    try:
        idx = L3Index.open(cfg.index_path, cfg.index_map_size, readonly=True)
    except Exception as exc:  # noqa: BLE001 - doctor reports, never raises
        out["error"] = f"{type(exc).__name__}: {exc}"
        return out
    try:
        out["entries_for_deployment"] = sum(1 for _ in idx.iter_prefix(deployment_tag(cfg.deployment_id)))
        out["entries_total"] = idx.count()
    finally:
        idx.close()
    return out


def _slabs(cfg) -> list[dict]:
    from ..store import read_slab_meta

    rows = []
    for rank in range(cfg.num_ranks):
        d = cfg.slab_dir(rank)
        names = sorted(n for n in os.listdir(d) if n.endswith(".slab")) if os.path.isdir(d) else []
        for name in names:
            path = os.path.join(d, name)
            meta = read_slab_meta(path) or {}
            rows.append({"rank": rank, "path": path, "bytes": os.path.getsize(path),
                         "slots": meta.get("num_slots"), "page_bytes": meta.get("page_bytes"),
                         "namespace": meta.get("ns_digest")})
        if not names:
            rows.append({"rank": rank, "path": d, "bytes": 0, "slots": None, "page_bytes": None, "namespace": None})
    return rows


def report(values: dict) -> tuple[dict, list[str]]:
    """(the "l3" section of doctor's JSON, problems)."""
    if not ENABLE_CP_L3.value_in(values):
        return {"active": False}, []
    path = CP_L3_CONFIG.value_in(values)
    out: dict[str, Any] = {"active": True, "backend_class": f"{attach.MODULE_PATH}.{attach.CLASS_NAME}",
                           "hicache_storage_backend": "dynamic", "config": path}
    from .hooks import check_l3_config

    try:
        cfg = check_l3_config(path)
    except PluginFlagError as exc:
        out["error"] = str(exc)
        return out, [str(exc)]
    out["extra_config"] = attach.extra_config(path)
    out["state"] = {"deployment_id": cfg.deployment_id, "cold_start": cfg.cold_start, "ack": cfg.ack,
                    "wait_ms": cfg.wait_ms, "ranks": cfg.num_ranks,
                    "require_plp": cfg.require_plp, "plp": cfg.plp, "index": _index_state(cfg),
                    "slabs": _slabs(cfg)}
    return out, []


def render(section: dict) -> list[str]:
    if not section.get("active"):
        return []
    lines = [f"L3 backend: {section['backend_class']} via --hicache-storage-backend dynamic"]
    if "error" in section:
        return lines + [f"  config {section['config']}: {section['error']}"]
    extra = dict(section["extra_config"])
    lines.append("  extra config: " + attach.dump_json(extra))
    st = section["state"]
    idx = st["index"]
    entries = idx.get("entries_for_deployment", "no index yet" if not idx["exists"] else idx.get("error"))
    lines.append(f"  deployment {st['deployment_id']!r}: cold_start={st['cold_start']}, ack={st.get('ack')}, "
                 f"ranks={st['ranks']}, "
                 f"index {idx['path']} ({entries} entries)")
    for row in st["slabs"]:
        lines.append(f"  rank {row['rank']} slab {row['path']}: {row['bytes']} B, {row['slots']} slots of "
                     f"{row['page_bytes']} B pages, namespace {row['namespace']}")
    return lines
