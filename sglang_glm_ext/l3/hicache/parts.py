"""What one rank holds of a page when context-parallel ranks hold different bytes. Pure: no SGLang, no torch.

Plain attention CP keeps the same bytes on every CP rank (``cp_writers.py``). In three SGLang 0.5.23 modes each rank
holds its own *part* of a page instead (``docs_internal/l3_cp.md``, "Ranks that hold different bytes"):

* ``--enable-dsa-cache-layer-split`` (served): CP rank ``r`` of ``N`` holds the contiguous device layers
  ``get_layer_shard_range(r, N, L)`` of every page (``layers/cp/utils.py:94-106``), padded to ``ceil(L / N)`` host
  layers, plus its own live indexer layers. :class:`LayerPart` names that part; it goes into the namespace, so a
  rank only ever finds pages of its own part, and a different split is another namespace (a miss).
* ``--enable-kv-cache-sharding`` (refused at launch; the translation is here and tested against SGLang's own
  placement): logical host page ``h`` is held whole by shard rank ``h % N`` as its local page ``h // N``
  (``mem_cache/page_interleave.py:85-112``, ``pool_host/page_interleave.py:86-102``). :func:`kv_stripe` maps a
  storage call's logical host indices to (mine?, local page) per page.
* ``--dcp-size > 1`` (refused: SGLang itself refuses L3 under DCP for GLM's pools, :data:`DCP_REFUSED`).

A page is a hit only where every part of it is durable: each rank answers ``exists`` / ``get`` for its own part, and
SGLang's MIN over the controller's storage sync groups (``cache_controller.py:404-447``, used at ``:1375-1379`` and
``:1481-1485``; hybrid ``hybrid_cache_controller.py:1502-1506``) decides one prefix for every rank. That is right only
if every rank holding a part of the page takes part in one of those groups: :func:`uncovered` is the attach check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

__all__ = ["LayerPart", "uncovered", "kv_stripe", "KV_SHARDING_REFUSED", "DCP_REFUSED"]

# Why two modes whose ranks hold different bytes stay refused (docs_internal/l3_cp.md); hooks.translate and the attach
# say the same. Each is one line, naming what would have to change.
KV_SHARDING_REFUSED = (
    "SGLang 0.5.23's prefetch allocates host slots without the chain's rotation owner "
    "(PageInterleaveHostPool.alloc asserts on it) and inserts prefetched nodes without a rotation_base, so serving "
    "needs SGLang patches on the scheduler's rotation invariant that only a GPU PD-prefill run can validate")
DCP_REFUSED = (
    "SGLang 0.5.23 itself refuses L3 under DCP for GLM's pools (the DSA indexer pool of GLM-5 for every backend, "
    "cache_controller.py:574-584; MHA HiCache of GLM-4.x at launch, hicache_hook.py:157-162), and serving plain MLA "
    "would need a replacement of its file/Mooncake-only gate (cache_controller.py:559-563) that no GLM model could use")


@dataclass(frozen=True)
class LayerPart:
    """This rank's part of every page under DSA cache layer split.

    ``rank`` / ``size``: its place in the layer-shard group (SGLang's attention-CP group, ``layers/cp/utils.py:61-73``);
    ``layer_start`` / ``layer_end``: the model layer ids it stores (global, ``[start, end)``); ``device_layers``: the
    stage's layer count being split; ``group_ranks``: the global ranks of the layer-shard group (for :func:`uncovered`).
    """

    rank: int
    size: int
    layer_start: int
    layer_end: int
    device_layers: int
    group_ranks: tuple[int, ...]

    def __post_init__(self):
        if not (self.size > 1 and 0 <= self.rank < self.size):
            raise ValueError(f"layer split rank {self.rank} of {self.size}")
        if not self.layer_start < self.layer_end:
            raise ValueError(f"layer split part owns no layer: [{self.layer_start}, {self.layer_end})")
        if len(self.group_ranks) != self.size:
            raise ValueError(f"layer split group has {len(self.group_ranks)} ranks, size {self.size}")

    @property
    def host_layers(self) -> int:
        """Target host layers per page on every rank: ``ceil(L / N)`` (the assembler's ``target_layer_num``,
        ``hybrid_pool_assembler.py:207-211``); a rank owning fewer layers keeps the last host layer unwritten."""
        return -(-self.device_layers // self.size)


def uncovered(part_ranks: Sequence[int], sync_groups: Sequence[Sequence[int]]) -> str:
    """'' when one of SGLang's storage sync groups holds every rank of ``part_ranks`` (the ranks holding the parts
    of one page), else why not. The MIN over a group that misses a part-holder could agree on a page whose part on
    that rank is absent: its host slot would then be read as whatever it held."""
    want = set(int(r) for r in part_ranks)
    if len(want) <= 1:
        return ""
    for group in sync_groups:
        if want <= set(int(r) for r in group):
            return ""
    return (f"the ranks holding the parts of a page {sorted(want)} are not all in one of the HiCache controller's "
            f"storage MIN groups {[sorted(int(r) for r in g) for g in sync_groups]}: its hit and completion MINs "
            "could agree on a page one part of which is missing")


def kv_stripe(host_indices, n: int, *, page_size: int, shard_size: int, shard_rank: int,
              local_pages: int) -> "tuple[list[bool], list[int]] | None":
    """KV sharding (``--enable-kv-cache-sharding``): for each of ``n`` storage pages in ``host_indices`` (logical host
    slots, ``n * page_size`` of them, each page a contiguous run), whether this shard rank holds it and its local
    host page, or None when the indices are not ``n`` whole logical pages whose local pages lie in ``[0,
    local_pages)``. The same arithmetic as SGLang's ``PageInterleavePlacement`` (owner ``(loc % (N*ps)) // ps``, local
    row ``(loc // (N*ps))*ps + loc % ps``): a logical page ``h`` is rank ``h % N``'s local page ``h // N``."""
    import numpy as np  # here, not at import: the launch hooks read this module's refusals

    ps = page_size
    if n <= 0 or shard_size < 1 or not 0 <= shard_rank < shard_size or host_indices.ndim != 1 \
            or host_indices.shape[0] != n * ps:
        return None
    rows = host_indices.reshape(n, ps)
    starts = rows[:, 0]
    if starts.min() < 0 or np.any(starts % ps) or not ((rows - starts[:, None]) == np.arange(ps)[None, :]).all():
        return None
    logical = starts // ps
    mine = (logical % shard_size) == shard_rank
    local = logical // shard_size
    if local.max() >= local_pages:
        return None
    return mine.tolist(), local.tolist()
