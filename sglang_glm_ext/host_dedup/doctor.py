"""host_dedup's part of `doctor`: the section `host_dedup`, which pools of the launch being checked run
deduplicated, and why not where they do not.

Keys: `mode` (asked: auto/on/off), `on` (bool, for rank 0 of the launch), `why_not` ('' when on), `pools` ({pool:
"deduplicated" or the reason}), `replicas_per_node` (ranks holding the same KV on one node), `host_copies_per_node`
and `disk_reads_per_hit` (copies of a page a node holds in host RAM / reads from L3 on a hit: 1 under dedup, else
the replica count). Read from the plugin flags and the SGLang arguments doctor was given (`doctor -- python -m
sglang.launch_server ...`); without them the launch is one rank. No problems: dedup off is SGLang's own path.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..declare import DoctorInput, DoctorPart, DoctorReporter
from .feature import HICACHE_HOST_DEDUP
from .plan import Facts, decide, resolve_mode

_POOLS = ("kv", "indexer")


def _int(launch: Mapping[str, Any], key: str, default: int = 1) -> int:
    try:
        return int(launch.get(key) or default)
    except (TypeError, ValueError):
        return default


def facts_of(values: Mapping[str, Any], launch: Mapping[str, Any]) -> Facts:
    spec = launch.get("speculative_algorithm")
    dtype = str(launch.get("kv_cache_dtype") or "")
    storage = "l3" if values.get("enable_cp_l3") else str(launch.get("hicache_storage_backend") or "")
    return Facts(mode=resolve_mode(HICACHE_HOST_DEDUP.value_in(values)), tp_size=_int(launch, "tp_size"),
                 pp_size=_int(launch, "pp_size"), nnodes=_int(launch, "nnodes"),
                 attn_cp_size=_int(launch, "attn_cp_size"),
                 attn_dp_size=_int(launch, "dp_size") if launch.get("enable_dp_attention") else 1,
                 layer_split=bool(launch.get("enable_dsa_cache_layer_split")), fp4_kv="fp4" in dtype,
                 speculative=bool(spec) and str(spec).upper() != "NONE",
                 kv_sharding=bool(launch.get("enable_kv_cache_sharding")), storage=storage)


def report(inp: DoctorInput) -> DoctorPart:
    try:
        f = facts_of(inp.values, inp.launch)
        plan = decide(f)
    except (ValueError, ZeroDivisionError, StopIteration) as exc:
        return DoctorPart({}, sections={"host_dedup": {"mode": "?", "on": False, "why_not": str(exc), "pools": {},
                                                       "replicas_per_node": 1, "host_copies_per_node": 1,
                                                       "disk_reads_per_hit": 1}})
    width = f.attn_cp_size * f.attn_tp_size
    replicas = max(1, min(width, f.tp_size_per_node))
    copies = 1 if plan.on else replicas
    return DoctorPart({}, sections={"host_dedup": {
        "mode": plan.mode, "on": plan.on, "why_not": plan.why_not,
        "pools": {p: "deduplicated" if plan.on else plan.why_not for p in _POOLS},
        "replicas_per_node": replicas, "host_copies_per_node": copies, "disk_reads_per_hit": copies}})


def render(hardware, sections) -> list[str]:
    d = sections.get("host_dedup") or {}
    if not d:
        return []
    head = f"  host dedup (--hicache-host-dedup {d['mode']}): "
    if d["on"]:
        return [head + f"on for {', '.join(d['pools'])}; 1 host copy and 1 disk read per page per node "
                f"(of {d['replicas_per_node']} replicas)"]
    return [head + f"off ({d['why_not']}); {d['host_copies_per_node']} host copies per page per node"]


REPORTER = DoctorReporter(report, render, hardware=(), sections=("host_dedup",))
