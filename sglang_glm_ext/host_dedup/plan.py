"""Who holds the host copy, decided once per process from facts every rank reads alike. Pure: no SGLang, no torch.

A replica set is the ranks holding the same MLA/DSA bytes: one pipeline stage, one attention-DP group, every
attention-CP and attention-TP rank of it. Dedup groups split it by node (each node has its own host RAM and its own
L3 disks): the first member of a group on a node is its *source* (real host pools, D2H, L3 reads and writes), the
others are *peers* (SGLang's allocator-only pools). Placement follows SGLang's launch (``data_parallel_controller``:
``tp_size_per_node = tp_size // max(nnodes // pp_size, 1)``); global rank = ``pp_rank * tp_size + tp_rank``.

Not deduplicated, each with its reason (``Facts`` -> ``DedupPlan.why_not``): MHA KV (each TP rank holds its own
heads), DSA cache layer split (each CP rank holds its own layers), FP4 KV (its per-rank scales are not broadcast),
speculative decoding (packed NextN draft layers and sidecar draft pools: 0.5.23 has no draft broadcast), decode CP
and KV sharding (rank-local pages), a storage backend other than none or the plugin's L3 (others read and write
allocator-only pools), and a replica set with one rank on the node. Attention-DP groups are never merged: they
serve different requests, not in lockstep.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

__all__ = ["MODES", "Facts", "DedupPlan", "decide", "resolve_mode", "dedup_groups", "plan_digest"]

MODES = ("auto", "on", "off")
# auto stays off until a multi-GPU benchmark (benchmark/host_dedup_bench.py on a real node) shows hot rounds are not
# slower: a cache project beside SGLang shipped node dedup on by default and turned it off after a 19-31% slowdown.
AUTO_RESOLVES_TO = "off"
PLUGIN_BACKEND = "sglang_glm_ext.l3"  # the L3 backend's extra-config backend_name (l3/hicache/extra_config.py)


def resolve_mode(value) -> str:
    mode = "auto" if value in (None, "") else str(value).strip().lower()
    if mode not in MODES:
        raise ValueError(f"hicache host dedup mode {value!r}: expected one of {', '.join(MODES)}")
    return mode


@dataclass(frozen=True)
class Facts:
    """What the decision reads: the launch's arguments and this process's place (identical on every rank but
    ``tp_rank`` / ``pp_rank``)."""

    mode: str = "auto"
    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    nnodes: int = 1
    attn_cp_size: int = 1
    attn_dp_size: int = 1
    mla: bool = True
    layer_split: bool = False
    fp4_kv: bool = False
    speculative: bool = False
    dcp: bool = False
    kv_sharding: bool = False
    storage: str = ""  # "" none, "l3" the plugin's backend, else the backend's name

    @property
    def attn_tp_size(self) -> int:
        return self.tp_size // (self.attn_cp_size * self.attn_dp_size)

    @property
    def tp_size_per_node(self) -> int:
        return self.tp_size // max(self.nnodes // self.pp_size, 1)


@dataclass(frozen=True)
class DedupPlan:
    """``on``: this process runs deduplicated; ``why_not``: the reason it does not ('' when on); ``group``: the
    global ranks of this rank's dedup group (source first); ``groups``: every dedup group of the world, in the one
    order every rank creates them (process-group creation is world-collective)."""

    mode: str
    on: bool
    why_not: str
    group: tuple[int, ...] = ()
    groups: tuple[tuple[int, ...], ...] = ()
    me: int = 0

    @property
    def source(self) -> int:
        return self.group[0] if self.group else self.me

    @property
    def is_source(self) -> bool:
        return not self.on or self.me == self.source

    @property
    def is_peer(self) -> bool:
        return self.on and self.me != self.source

    def describe(self) -> str:
        if not self.on:
            return f"off ({self.why_not})"
        role = "source" if self.is_source else f"peer of rank {self.source}"
        return f"on: this rank is the {role}; group {list(self.group)}"


def _excluded(f: Facts) -> str:
    if not f.mla:
        return "MHA KV: each TP rank holds its own heads, nothing is replicated"
    if f.layer_split:
        return "DSA cache layer split: each CP rank holds its own layers of a page"
    if f.fp4_kv:
        return "FP4 KV: its per-rank scale buffers are not covered by SGLang's broadcast"
    if f.speculative:
        return "speculative decoding: packed NextN draft layers and sidecar draft pools have no broadcast in 0.5.23"
    if f.dcp:
        return "decode context parallelism: each rank holds its own slice of a page"
    if f.kv_sharding:
        return "KV cache sharding: each rank holds its own pages"
    if f.storage not in ("", "l3"):
        return (f"storage backend {f.storage!r}: only no storage or the plugin's L3 serve allocator-only peer pools "
                "(peers read and write nothing)")
    return ""


def dedup_groups(f: Facts) -> tuple[tuple[int, ...], ...]:
    """Every dedup group of the world (global ranks), per pipeline stage, attention-DP group and node, in order."""
    width = f.attn_cp_size * f.attn_tp_size
    per_node = f.tp_size_per_node
    out = []
    for pp in range(f.pp_size):
        for first in range(0, f.tp_size, width):
            by_node: dict[int, list[int]] = {}
            for tp in range(first, first + width):
                by_node.setdefault(tp // per_node, []).append(pp * f.tp_size + tp)
            out += [tuple(g) for _, g in sorted(by_node.items())]
    return tuple(out)


def decide(f: Facts) -> DedupPlan:
    mode = resolve_mode(f.mode)
    me = f.pp_rank * f.tp_size + f.tp_rank
    effective = AUTO_RESOLVES_TO if mode == "auto" else mode
    if effective == "off":
        why = "switched off" if mode == "off" else "auto: off until a multi-GPU benchmark decides the default"
        return DedupPlan(mode, False, why, me=me)
    why = _excluded(f)
    groups = dedup_groups(f)
    mine = next(g for g in groups if me in g)
    if not why and len(mine) == 1:
        why = "this rank is the only replica of its pages on its node"
    if why:
        return DedupPlan(mode, False, why, me=me)
    return DedupPlan(mode, True, "", mine, tuple(g for g in groups if len(g) > 1), me)


def plan_digest(*parts: bytes) -> int:
    """A signed 63-bit digest of a load plan's bytes (host slots in logical page order, their count): ranks in
    lockstep compute the same value; ranks that would land different pages do not."""
    h = hashlib.blake2b(digest_size=8)
    for p in parts:
        h.update(len(p).to_bytes(8, "little"))
        h.update(p)
    return int.from_bytes(h.digest(), "little", signed=True) >> 1
