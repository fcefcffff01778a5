"""Who writes which page under context parallelism, and which L3 rank a process is on its node. Pure: no SGLang.

Under plain attention CP (and attention TP) an MLA/DSA page holds the same bytes on every rank of its replica set
(DSA all-gathers the KV before saving it; MLA's latent KV is not split by heads). The namespace therefore names no
CP or TP rank (``keys.ShardIdentity.replicated``): every rank finds what any rank wrote through the node's shared
index. Stock SGLang 0.5.23 lets one rank write (``HiCacheStorageConfig.is_storage_writer``: ``tp_rank ==
dcp_rank``); the plugin's ``l3.cp_storage_writers`` patch makes SGLang hand every page to every replica, and the
backend keeps exactly one *owner* per page among the replicas on its node:

    owner(page) = writers[int.from_bytes(key[:8], "little") % len(writers)]

``key`` is the page's 32-byte storage key (SGLang's SHA-256 chain of the page, identical on every rank), so every
rank computes the same owner without talking to the others, a restart keeps the same owners (``load`` needs no
agreement), and a page's KV and DSA-indexer bytes have one owner (sidecar pools derive their keys from the page
key: the owner is taken before). Content, not position: the position is known to the backend only when SGLang passes
prefix keys (``hicache_storage_pass_prefix_keys``), and SGLang's key is already a function of the whole prefix, so a
position owner would add nothing but that dependency. SHA-256 spreads pages evenly: with ``n`` writers each gets
``1/n`` of the pages, within binomial noise.

Nodes: a replica set may span nodes (a CP group of 16 over two 8-GPU nodes). Each node has its own disks and index,
so ``writers`` are the replicas on *this* node: every node holds what its own ranks read, and nothing crosses a node
on the data path. Placement follows SGLang's scheduler launch (``data_parallel_controller.py``: ``tp_size_per_node =
tp_size // max(nnodes // pp_size, 1)``, ``pp_size_per_node = max(pp_size // nnodes, 1)``); the L3 rank is the
process's position on its node, so ``ranks.count`` in the L3 config counts one node's ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import WRITER_MODES

__all__ = ["WRITER_MODES", "Topology", "TopologyError", "WriterPlan", "owner_index"]


class TopologyError(ValueError):
    """The parallel layout cannot be mapped onto nodes (the backend refuses to attach)."""


def owner_index(key: bytes, n: int) -> int:
    """Index of the owner among ``n`` writers of the page with 32-byte storage key ``key``."""
    return int.from_bytes(key[:8], "little") % n


@dataclass(frozen=True)
class Topology:
    """This process's place in SGLang's parallel layout (the fields SGLang publishes in ``get_parallel()``)."""

    tp_rank: int
    tp_size: int
    pp_rank: int = 0
    pp_size: int = 1
    attn_cp_size: int = 1
    attn_dp_size: int = 1
    nnodes: int = 1
    # DSA cache layer split: each attention-CP rank holds its own layers of a page, so only the ranks of the same
    # CP rank (its attention-TP ranks) hold the same bytes (``parts.LayerPart``)
    cp_parts: bool = False

    def __post_init__(self):
        if min(self.tp_size, self.pp_size, self.attn_cp_size, self.attn_dp_size, self.nnodes) < 1:
            raise TopologyError(f"parallel sizes must be >= 1: {self}")
        if not (0 <= self.tp_rank < self.tp_size and 0 <= self.pp_rank < self.pp_size):
            raise TopologyError(f"rank outside its group: {self}")
        if self.tp_size % (self.attn_cp_size * self.attn_dp_size):
            raise TopologyError(f"tp_size {self.tp_size} is not a multiple of attn_cp_size x attn_dp_size "
                                f"({self.attn_cp_size} x {self.attn_dp_size})")
        if self.tp_size % self.nnodes_per_tp_group:
            raise TopologyError(f"tp_size {self.tp_size} does not split over {self.nnodes_per_tp_group} nodes "
                                f"(nnodes {self.nnodes}, pp_size {self.pp_size})")

    # SGLang's launch placement (data_parallel_controller.py, launch of the scheduler processes)
    @property
    def nnodes_per_tp_group(self) -> int:
        return max(self.nnodes // self.pp_size, 1)

    @property
    def tp_size_per_node(self) -> int:
        return self.tp_size // self.nnodes_per_tp_group

    @property
    def pp_size_per_node(self) -> int:
        return max(self.pp_size // self.nnodes, 1)

    @property
    def attn_tp_size(self) -> int:
        return self.tp_size // (self.attn_cp_size * self.attn_dp_size)

    @property
    def attn_cp_rank(self) -> int:
        # SGLang's rank layout (runtime_context.derive_attention_ranks): tp = (dp * cp + cp_rank) * attn_tp + attn_tp
        return (self.tp_rank // self.attn_tp_size) % self.attn_cp_size

    def node_of(self, pp_rank: int, tp_rank: int) -> int:
        return (pp_rank // self.pp_size_per_node) * self.nnodes_per_tp_group + tp_rank // self.tp_size_per_node

    @property
    def node(self) -> int:
        return self.node_of(self.pp_rank, self.tp_rank)

    @property
    def local_rank(self) -> int:
        """The L3 rank: this process's position among its node's processes (slab directory, disk, owner lock)."""
        return (self.pp_rank % self.pp_size_per_node) * self.tp_size_per_node + self.tp_rank % self.tp_size_per_node

    @property
    def ranks_per_node(self) -> int:
        return self.pp_size_per_node * self.tp_size_per_node

    def replicas(self) -> tuple[int, ...]:
        """TP ranks holding the same replicated (MLA/DSA) pages as this one: its pipeline stage, its attention-DP
        group, every CP and attention-TP rank; with ``cp_parts`` only the attention-TP ranks of its own CP rank
        (the others hold other layers)."""
        if self.cp_parts:
            first = (self.tp_rank // self.attn_tp_size) * self.attn_tp_size
            return tuple(range(first, first + self.attn_tp_size))
        width = self.attn_cp_size * self.attn_tp_size
        first = (self.tp_rank // width) * width
        return tuple(range(first, first + width))

    def replicas_on_node(self) -> tuple[int, ...]:
        return tuple(t for t in self.replicas() if self.node_of(self.pp_rank, t) == self.node)

    def local_rank_of(self, tp_rank: int) -> int:
        return (self.pp_rank % self.pp_size_per_node) * self.tp_size_per_node + tp_rank % self.tp_size_per_node


@dataclass(frozen=True)
class WriterPlan:
    """Which pages this rank writes. ``writers``: TP ranks of this node's replicas that write, in owner order;
    ``me``: this rank's index among them, or -1 (it writes nothing). Every replica on the node builds the same
    ``writers`` from the same topology, so each page has exactly one owner."""

    mode: str
    writers: tuple[int, ...]
    me: int

    @classmethod
    def build(cls, topo: Topology, mode: str) -> "WriterPlan":
        if mode not in WRITER_MODES:
            raise TopologyError(f"writers.mode {mode!r}: expected one of {WRITER_MODES}")
        on_node = topo.replicas_on_node()
        writers = on_node if mode == "spread" else on_node[:1]
        return cls(mode, writers, writers.index(topo.tp_rank) if topo.tp_rank in writers else -1)

    @property
    def writes_everything(self) -> bool:
        return len(self.writers) == 1 and self.me == 0

    def owned(self, keys: list[bytes]) -> list[bool]:
        """For each 32-byte storage key: does this rank write it?"""
        if self.writes_everything:
            return [True] * len(keys)
        if self.me < 0:
            return [False] * len(keys)
        n, me = len(self.writers), self.me
        return [owner_index(k, n) == me for k in keys]

    def owner_indices(self, keys: list[bytes]) -> list[int]:
        """For each 32-byte storage key: its owner's index into :attr:`writers` (-1 for every key where this plan
        has no writer)."""
        n = len(self.writers)
        if n == 1:
            return [0] * len(keys)
        if n == 0:
            return [-1] * len(keys)
        return [owner_index(k, n) for k in keys]

    def owner_of(self, key: bytes) -> int:
        """The TP rank that writes ``key``."""
        return self.writers[owner_index(key, len(self.writers))]
