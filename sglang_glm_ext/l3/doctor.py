"""L3's part of ``sglang-glm-ext doctor``, one part for the whole feature:

* under ``hardware``, each configured L3 path: exists, O_DIRECT, free space against its budget (``l3_paths``; the
  launch check's own probe, ``disk/probe.py``: every directory the engine writes in created and written in
  miniature, nothing left behind),
  and the checksum's build: the xxhash version and the vector unit XXH3 runs on (``l3_checksum``; a warning, not a
  problem, when the CPU has vector units the build leaves unused);
* the top-level ``"l3"`` section: the backend class SGLang will build, the extra config the flag hook resolves to,
  and the L3 state on disk (index entries of this deployment, slabs per rank).

The config is read and checked as a launch does it (``launch.plan_launch``, one read of the file per process, so
doctor and a launch refuse in the same words). Read-only: the index is opened read-only (LMDB allows it next to a
running server), slabs are only stat'ed and their JSON sidecars read.
"""

from __future__ import annotations

import os
from typing import Any

from ..declare import DoctorInput, DoctorPart, DoctorReporter, PluginFlagError
from .feature import CP_L3_CONFIG, ENABLE_CP_L3
from .launch import load_config, plan_launch

__all__ = ["report", "l3_paths", "render", "render_section", "render_checksum", "REPORTER"]

# The fix doctor shows for each L3 problem (each names the config key or path at fault; the launch refuses it alike).
FIX = ("correct what it names in the --cp-l3-config file or on its disks (a writable directory per [[disks]] entry, "
       "a budget within free space); `sglang-glm-ext l3 example-config --dir DIR` writes a valid config")


def report(inp: DoctorInput) -> DoctorPart:
    path = inp.values.get(CP_L3_CONFIG.name)
    enabled = bool(ENABLE_CP_L3.value_in(inp.values))
    cfg, plan, problems = _load(path, enabled)
    rows = l3_paths(cfg, path, problems) if cfg is not None else []
    section = _section(enabled, path, cfg, plan, problems)
    return DoctorPart({"l3_paths": rows, "l3_checksum": _checksum()}, tuple(dict.fromkeys(problems)),
                      sections={"l3": section}, fix=FIX)


def _checksum() -> dict:
    from .disk.format import checksum_build

    try:
        return checksum_build()
    except Exception as exc:  # noqa: BLE001 - doctor reports, never raises
        return {"error": f"{type(exc).__name__}: {exc}"}


def render_checksum(row: dict) -> list[str]:
    """The ``l3_checksum`` hardware row as text lines."""
    if not row:
        return []
    if "error" in row:
        return [f"  L3 checksum: xxhash not usable ({row['error']})"]
    lines = [f"  L3 checksum: xxhash {row['version']} (xxHash {row['xxhash_c']}), XXH3 on {row['vector'] or 'unknown'} "
             f"({row['how']}); CPU best {row['cpu_best'] or 'unknown'}"]
    if row.get("warning"):
        lines.append(f"    warning: {row['warning']}")
    return lines


def _load(path: str | None, enabled: bool):
    """(config or None, launch plan or None, problems): the config as the launch reads it (its disks are shown
    whether or not L3 is on); with L3 switched on, the launch's own plan, or its refusal as the problem."""
    cfg = None
    if path:
        try:
            cfg = load_config(path)
        except PluginFlagError as exc:
            return None, None, [str(exc)]
    if not enabled:
        return cfg, None, []
    try:
        return cfg, plan_launch(True, path), []
    except PluginFlagError as exc:
        return cfg, None, [str(exc)]


def l3_paths(cfg, config_path: str, problems: list[str]) -> list[dict[str, Any]]:
    """One row per configured disk: exists, O_DIRECT and free space as the launch check's probe found them (every
    directory the engine writes in, created and written in miniature), and the budget's fit; its problems join
    ``problems`` in the launch check's own words."""
    from .disk.probe import probe_config
    from .disk.space import budget_fit

    probes = probe_config(cfg)
    where = f"--cp-l3-config {config_path}: "
    fit = budget_fit(cfg, config_path)  # what the launch check refuses, in the same words
    rows = []
    for i, (disk, space) in enumerate(zip(cfg.disks, fit)):
        mine = [p for p in probes if p.key == f"disks[{i}].path"]
        first = mine[0]
        row = {"path": disk.path, "exists": first.exists, "budget_bytes": disk.budget,
               "free_bytes": space.get("free_bytes", first.free_bytes), "o_direct": first.o_direct,
               "o_direct_detail": first.o_direct_detail,
               "problems": list(dict.fromkeys(where + p.problem for p in mine if p.problem))}
        row.update({k: space[k] for k in ("slab_bytes", "held_bytes", "need_bytes") if k in space})
        if space.get("problem") and not row["problems"]:  # a path that cannot be used has no budget to fit
            row["problems"].append(space["problem"])
        rows.append(row)
        problems.extend(row["problems"])
    problems.extend(where + p.problem for p in probes if p.problem and p.key == "index.path")
    return rows


def _section(enabled: bool, path: str | None, cfg, plan, problems: list[str]) -> dict:
    """The "l3" section of doctor's JSON."""
    from .hicache import extra_config

    if not enabled:
        return {"active": False}
    out: dict[str, Any] = {"active": True,
                           "backend_class": f"{extra_config.MODULE_PATH}.{extra_config.CLASS_NAME}",
                           "hicache_storage_backend": "dynamic", "config": path}
    if plan is None or problems:  # the plan's refusal, or a problem of a configured path
        out["error"] = problems[0]
        return out
    out["extra_config"] = dict(plan.extra_config)
    out["state"] = {"deployment_id": cfg.deployment_id, "cold_start": cfg.cold_start, "ack": cfg.ack,
                    "wait_ms": cfg.wait_ms, "ranks": cfg.num_ranks,
                    "require_plp": cfg.require_plp, "plp": cfg.plp, "index": _index_state(cfg),
                    "slabs": _slabs(cfg)}
    return out


def _index_state(cfg) -> dict:
    from .engine.index import L3Index, deployment_tag

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
    from .disk.slab_dir import read_slab_meta

    rows = []
    for rank in range(cfg.num_ranks):
        for disk in cfg.disks_for_rank(rank):
            d = cfg.slab_dir(rank, disk)
            names = sorted(n for n in os.listdir(d) if n.endswith(".slab")) if os.path.isdir(d) else []
            for name in names:
                path = os.path.join(d, name)
                meta = read_slab_meta(path) or {}
                rows.append({"rank": rank, "disk": disk, "path": path, "bytes": os.path.getsize(path),
                             "slots": meta.get("num_slots"), "page_bytes": meta.get("page_bytes"),
                             "namespace": meta.get("ns_digest")})
            if not names:
                rows.append({"rank": rank, "disk": disk, "path": d, "bytes": 0, "slots": None, "page_bytes": None,
                             "namespace": None})
    return rows


def render_section(section: dict) -> list[str]:
    """The "l3" section as text lines."""
    from .hicache import extra_config

    if not section.get("active"):
        return []
    lines = [f"L3 backend: {section['backend_class']} via --hicache-storage-backend dynamic"]
    if "error" in section:
        return lines + [f"  config {section['config']}: {section['error']}"]
    lines.append("  extra config: " + extra_config.dump_json(dict(section["extra_config"])))
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


def render(hardware: dict, sections: dict) -> list[str]:
    """doctor's text lines for `l3_paths`, `l3_checksum` and the "l3" section."""
    lines = [f"  L3 path {row['path']}: o_direct={row.get('o_direct')} free={row.get('free_bytes')} "
             f"budget={row.get('budget_bytes')} held={row.get('held_bytes')} need={row.get('need_bytes')}"
             for row in hardware.get("l3_paths") or ()]
    return lines + render_checksum(hardware.get("l3_checksum") or {}) + render_section(sections.get("l3") or {})


REPORTER = DoctorReporter(report, render, hardware=("l3_paths", "l3_checksum"), sections=("l3",))
