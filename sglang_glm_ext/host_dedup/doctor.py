"""host_dedup's part of `doctor`: the section `host_dedup`, which pools of the launch being checked run
deduplicated, and why not where they do not.

Keys: `mode` (asked: auto/on/off), `on` (bool, for rank 0 of the launch), `why_not` ('' when on), `pools` ({pool:
"deduplicated" or the reason}), `replicas_per_node` (ranks holding the same KV on one node), `host_copies_per_node`
and `disk_reads_per_hit` (copies of a page a node holds in host RAM / reads from L3 on a hit: 1 under dedup, else
the replica count). Read from the plugin flags and the SGLang arguments doctor was given (`doctor -- python -m
sglang.launch_server ...`); without them the launch is one rank. No problems: dedup off is SGLang's own path.

`sizing` (null without host pools or for FP4 KV; `sizing.py`): what the node's MLA/DSA host pools come to for GLM-5's
geometry: `model`, `page_size`, `layers_per_rank`, `bytes_per_token` (KV + DSA indexer, one rank),
`kv_bytes_per_token` (what --hicache-size divides), `sized_by` (hicache_size / hicache_ratio / auto),
`hicache_size_gb`, `hicache_ratio`, `tokens_per_pool`, `ranks_on_node`, `hit_tokens` (1000), and `off` / `on`
(`on`: with --hicache-host-dedup on, equal to `off` where this launch is excluded), each {`host_pools`, `host_bytes`
(pinned on the node), `distinct_tokens` (held on the node), `hit_disk_bytes` (one hit of `hit_tokens` reads on the
node), `largest_hicache_size_gb` (what SGLang's host-memory guard admits per pool on this host: (`available_bytes` -
10 GiB) / the ranks that pin pools; null where MemAvailable cannot be read)}; tokens and host bytes are null unless
--hicache-size sizes the pools; `available_bytes`: this host's MemAvailable (/proc/meminfo) when doctor ran.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from ..declare import DoctorInput, DoctorPart, DoctorReporter
from .feature import HICACHE_HOST_DEDUP
from .plan import Facts, decide, resolve_mode
from .sizing import glm5, node_sizing

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


def _float(value) -> float | None:
    try:
        return float(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None


def available_bytes(meminfo: str = "/proc/meminfo") -> int | None:
    """This host's MemAvailable (what SGLang's guard starts from, before its cgroup bound), or None."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def sizing_of(f: Facts, launch: Mapping[str, Any], replicas: int) -> dict | None:
    """The node's host bytes, distinct tokens and hit disk bytes, dedup on and off; None without host pools."""
    geom = glm5(str(launch.get("kv_cache_dtype") or ""))
    if geom is None or launch.get("enable_hierarchical_cache", True) is False:
        return None
    return node_sizing(geom, hicache_size_gb=_float(launch.get("hicache_size")) or 0,
                       hicache_ratio=_float(launch.get("hicache_ratio")), ranks_per_stage=f.tp_size_per_node,
                       stages=max(f.pp_size // max(f.nnodes, 1), 1), pp_size=f.pp_size, replicas=replicas,
                       dedup_applies=decide(replace(f, mode="on")).on, available_bytes=available_bytes())


def report(inp: DoctorInput) -> DoctorPart:
    try:
        f = facts_of(inp.values, inp.launch)
        plan = decide(f)
    except (ValueError, ZeroDivisionError, StopIteration) as exc:
        return DoctorPart({}, sections={"host_dedup": {"mode": "?", "on": False, "why_not": str(exc), "pools": {},
                                                       "replicas_per_node": 1, "host_copies_per_node": 1,
                                                       "disk_reads_per_hit": 1, "sizing": None}})
    width = f.attn_cp_size * f.attn_tp_size
    replicas = max(1, min(width, f.tp_size_per_node))
    copies = 1 if plan.on else replicas
    return DoctorPart({}, sections={"host_dedup": {
        "mode": plan.mode, "on": plan.on, "why_not": plan.why_not,
        "pools": {p: "deduplicated" if plan.on else plan.why_not for p in _POOLS},
        "replicas_per_node": replicas, "host_copies_per_node": copies, "disk_reads_per_hit": copies,
        "sizing": sizing_of(f, inp.launch, replicas)}})


def _bytes(n: int) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 1e9 else f"{n / 1e6:,.1f} MB"


def render_sizing(s: Mapping[str, Any]) -> list[str]:
    off, on = s["off"], s["on"]
    if s["tokens_per_pool"] is None:
        how = (f"--hicache-ratio {s['hicache_ratio']:g} x the device pool" if s["sized_by"] == "hicache_ratio"
               else "SGLang's auto-sizing") + ", sized at start"
        first = f"host pools with bytes: {off['host_pools']} dedup off, {on['host_pools']} on ({how})"
    else:
        first = (f"--hicache-size {s['hicache_size_gb']:g} GB per rank pins {_bytes(off['host_bytes'])} dedup off, "
                 f"{_bytes(on['host_bytes'])} on, for {off['distinct_tokens']:,} distinct tokens either way")
    ranks = f"{s['ranks_on_node']} rank{'s' if s['ranks_on_node'] != 1 else ''} on the node"
    lines = [f"  host dedup sizing ({s['model']}, {ranks}): {first}",
             f"    a {s['hit_tokens']:,}-token prefix hit reads {_bytes(off['hit_disk_bytes'])} from disk per node "
             f"dedup off, {_bytes(on['hit_disk_bytes'])} on"]
    if off.get("largest_hicache_size_gb") is not None and s.get("available_bytes"):
        lines.append(f"    this host ({_bytes(s['available_bytes'])} available now) admits --hicache-size up to "
                     f"{off['largest_hicache_size_gb']:g} GB dedup off, {on['largest_hicache_size_gb']:g} GB on "
                     "(SGLang's guard: available - 10 GiB, shared by the ranks that pin host pools)")
    return lines


def render(hardware, sections) -> list[str]:
    d = sections.get("host_dedup") or {}
    if not d:
        return []
    head = f"  host dedup (--hicache-host-dedup {d['mode']}): "
    if d["on"]:
        lines = [head + f"on for {', '.join(d['pools'])}; 1 host copy and 1 disk read per page per node "
                 f"(of {d['replicas_per_node']} replicas)"]
    else:
        lines = [head + f"off ({d['why_not']}); {d['host_copies_per_node']} host copies per page per node"]
    return lines + (render_sizing(d["sizing"]) if d.get("sizing") else [])


REPORTER = DoctorReporter(report, render, hardware=(), sections=("host_dedup",))
