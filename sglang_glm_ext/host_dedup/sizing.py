"""What a launch's MLA/DSA host pools come to per node, dedup on and off: host bytes pinned, distinct tokens held,
disk bytes one prefix hit reads. Pure: no SGLang, no torch.

How SGLang 0.5.23 sizes one rank's pools (``pool_host/base.py`` ``HostKVCache.__init__``, ``pool_host/dsa.py``):
``--hicache-size`` GB per rank sizes the KV pool alone, ``GB * 1e9 // KV bytes per token`` tokens rounded down to
pages plus one padding page (the minimum over pipeline stages); without it, ``--hicache-ratio`` x the device pool's
tokens, known only once the device pool exists. The DSA indexer pool takes the KV pool's token count and adds its
own bytes on top. Under dedup a peer builds the same slots with no buffer: for the same ``--hicache-size`` the node
holds the same distinct tokens in 1/replicas of the host bytes, and a hit is read from disk once, not once per
replica. SGLang's host-memory guard gives each rank (available RAM - 10 GiB) // ranks on the host; under dedup the
plugin counts only the ranks that pin pools (one a group), so a source may be given a ``--hicache-size`` up to the
RAM its peers leave free (``largest_hicache_size_gb``).

Geometry: GLM-5's (doctor reads no model config; the page l3_design.md's index sizing measures): 78 layers, 64-token
pages (SGLang sets 64 for DSA), MLA KV 656 B per token per layer in fp8 (512 + 16 scale + 128 rope), 1,152 B in 16
bits (576 x 2), DSA indexer 132 B (128 fp8 + a 4-byte scale). Layouts that keep the indexer separate (all but
``page_first_kv_split``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

__all__ = ["Geometry", "glm5", "HIT_TOKENS", "RESERVE_BYTES", "node_sizing", "largest_size_gb"]

HIT_TOKENS = 1000  # the prefix hit whose disk bytes doctor prints
RESERVE_BYTES = 10 * (1 << 30)  # SGLang's HICACHE_HOST_MEMORY_RESERVE_BYTES (pool_host/base.py), kept from the guard


@dataclass(frozen=True)
class Geometry:
    name: str
    layers: int
    page_size: int
    kv_row: int  # MLA KV bytes per token per layer
    indexer_row: int  # DSA indexer bytes per token per layer (0: none)


def glm5(kv_cache_dtype: str = "") -> Optional[Geometry]:
    """GLM-5's geometry for a --kv-cache-dtype: fp8 (its served KV, and 'auto') or 16-bit; None for another (FP4)."""
    dtype = (kv_cache_dtype or "auto").lower()
    if dtype in ("auto", "fp8_e4m3", "fp8_e5m2"):
        return Geometry("GLM-5, fp8 KV", 78, 64, 656, 132)
    if dtype in ("bf16", "bfloat16", "float16", "fp16", "half"):
        return Geometry("GLM-5, 16-bit KV", 78, 64, 1152, 132)
    return None


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def largest_size_gb(available_bytes: Optional[int], holders: int, token: int, kv_token: int) -> Optional[float]:
    """The largest ``--hicache-size`` (GB, one decimal, rounded down) whose KV and indexer pools fit one holder's share
    of the host under SGLang's guard: (available - 10 GiB) // holders. None without a reading."""
    if available_bytes is None or holders < 1:
        return None
    share = max(0, available_bytes - RESERVE_BYTES) // holders
    return int(share * kv_token / token / 1e8) / 10


def node_sizing(geom: Geometry, *, hicache_size_gb: float = 0, hicache_ratio: Optional[float] = None,
                ranks_per_stage: int = 1, stages: int = 1, pp_size: int = 1, replicas: int = 1,
                dedup_applies: bool = False, hit_tokens: int = HIT_TOKENS,
                available_bytes: Optional[int] = None) -> dict:
    """Per node: ``ranks_per_stage`` ranks of each of ``stages`` pipeline stages, in groups of ``replicas`` ranks
    holding the same bytes. ``off``/``on``: {host_pools, host_bytes, distinct_tokens, hit_disk_bytes,
    largest_hicache_size_gb}; ``on`` equals ``off`` where dedup does not apply to this launch. Tokens and host bytes
    are None unless --hicache-size sizes the pools (a ratio's device pool is known only at start); the largest size
    is None without ``available_bytes`` (the host's available RAM)."""
    layers = _ceil_div(geom.layers, max(pp_size, 1))  # the stage with the most layers sets the PP-wide minimum
    kv_token = geom.kv_row * layers
    token = (geom.kv_row + geom.indexer_row) * layers
    tokens = None
    if hicache_size_gb and hicache_size_gb > 0:
        tokens = (int(hicache_size_gb * 1e9 // kv_token) // geom.page_size + 1) * geom.page_size
    replicas = max(1, min(replicas, ranks_per_stage))
    sets = max(1, ranks_per_stage // replicas)  # distinct replica sets (attention-DP groups) of one stage
    hit_copy = _ceil_div(hit_tokens, geom.page_size) * geom.page_size * token * stages

    def row(copies: int) -> dict:
        pools = sets * copies * stages  # host pools on the node that hold bytes
        return {"host_pools": pools, "host_bytes": None if tokens is None else tokens * token * pools,
                "distinct_tokens": None if tokens is None else tokens * sets,
                "hit_disk_bytes": hit_copy * copies,
                "largest_hicache_size_gb": largest_size_gb(available_bytes, pools, token, kv_token)}

    return {"model": geom.name, "page_size": geom.page_size, "layers_per_rank": layers,
            "bytes_per_token": token, "kv_bytes_per_token": kv_token,
            "sized_by": ("hicache_size" if tokens is not None else
                         "hicache_ratio" if hicache_ratio is not None else "auto"),
            "hicache_size_gb": hicache_size_gb or None, "hicache_ratio": hicache_ratio,
            "tokens_per_pool": tokens, "ranks_on_node": ranks_per_stage * stages, "hit_tokens": hit_tokens,
            "available_bytes": available_bytes,
            "off": row(replicas), "on": row(1 if dedup_applies else replicas)}
