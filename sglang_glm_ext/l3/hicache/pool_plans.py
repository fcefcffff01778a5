"""SGLang host pool layouts -> engine ``PageLayout``s, decided once at attach. Pure: no SGLang, no torch.

Plan/run split (FlashInfer style): :func:`plan_pool` turns a pool's geometry (read off SGLang's host pool object by
``backend.py``) into a :class:`PoolPlan` holding a bounds-checked ``PageLayout`` over the pool's own buffers. The
hot path then only maps host token indices to page indices (:meth:`PoolPlan.pages`, vectorized, validated) and
hands ``(layout, pages)`` to ``L3Store.spill_from_layout`` / ``reload_into_layout``: no staging copy beyond the
engine's own, no per-page decisions.

Page ``p`` of every served layout is host token slots ``[p * page_size, (p + 1) * page_size)``, which is how SGLang
addresses storage pages too (``host_indices[i * page_size] // page_size``). ``PageLayout`` checks at construction
that every slice of every page lies inside its buffer, and :meth:`PoolPlan.pages` refuses an index outside
``[0, num_pages)``: a bad index from the caller is a refused call, never a write outside the host pool.

The payload byte order per layout is recorded in the namespace (``keys.PoolFormat``), so two layouts never read
each other's pages. Decisions (``DECISIONS``):

=============  ====================  ==================================================================
family         layout                decision
=============  ====================  ==================================================================
mla            layer_first           served: L slices per page (one per layer), layer-major payload
mla            page_first            served: one contiguous block per page (token-major)
mla            page_first_direct     served: one contiguous block per page (layer-major)
mla            page_unified          served: same bytes as page_first_direct (MLA has no head axis)
mla            page_first_kv_split   refused: Ascend-NPU split K/V/index buffers whose V is not persisted
                                     under FP8 DSA; no NPU support in this plugin
dsa_indexer    layer_first           served: L slices of one index page each
dsa_indexer    page_first(_direct)   served: one contiguous block per page
mha            layer_first           served: 2L slices per page (K layers, then V layers)
mha            page_first(_direct)   served: one K block and one V block per page
mha            page_head             served: one K block and one V block per page (head-major inside)
mha            page_unified          served: one block per page holding K and V
mha            asymmetric K/V width  refused: K and V rows differ (MiMo-style); not a GLM pool
=============  ====================  ==================================================================
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..disk.host_layout import PageLayout
from .keys import PoolFormat

__all__ = ["Buffer", "PoolGeometry", "PoolPlan", "LayoutRefused", "DECISIONS", "plan_pool", "decision"]


class LayoutRefused(ValueError):
    """The pool cannot be served by the L3 backend; the message says why and what to use instead."""


SERVED, REFUSED = "served", "refused"
DECISIONS: dict[tuple[str, str], tuple[str, str]] = {
    ("mla", "layer_first"): (SERVED, "one slice per layer and page"),
    ("mla", "page_first"): (SERVED, "one contiguous block per page"),
    ("mla", "page_first_direct"): (SERVED, "one contiguous block per page"),
    ("mla", "page_unified"): (SERVED, "same bytes as page_first_direct: MLA has no head axis"),
    ("mla", "page_first_kv_split"): (
        REFUSED, "page_first_kv_split is the Ascend-NPU split K/V/index host layout (FP8 DSA keeps no V there); "
        "the plugin serves CUDA hosts: use page_first, page_first_direct or layer_first"),
    ("dsa_indexer", "layer_first"): (SERVED, "one slice per layer and page"),
    ("dsa_indexer", "page_first"): (SERVED, "one contiguous block per page"),
    ("dsa_indexer", "page_first_direct"): (SERVED, "one contiguous block per page"),
    ("mha", "layer_first"): (SERVED, "K and V slices per layer and page"),
    ("mha", "page_first"): (SERVED, "one K and one V block per page"),
    ("mha", "page_first_direct"): (SERVED, "one K and one V block per page"),
    ("mha", "page_head"): (SERVED, "one K and one V block per page"),
    ("mha", "page_unified"): (SERVED, "one block per page holding K and V"),
}


def decision(family: str, layout: str) -> tuple[str, str]:
    return DECISIONS.get((family, layout), (REFUSED, f"no L3 mapping for a {family} pool in layout {layout!r}"))


@dataclass(frozen=True)
class Buffer:
    """A host buffer as (address, bytes). The caller keeps the memory alive (the backend holds the pool)."""

    address: int
    nbytes: int


@dataclass(frozen=True)
class PoolGeometry:
    """What the planner needs to know about one SGLang host pool (read by ``backend.py``)."""

    name: str                    # PoolName value
    family: str                  # mla | dsa_indexer | mha
    layout: str
    page_size: int               # tokens per host page
    num_pages: int               # pages the buffers hold
    layers: int                  # host layers per page (target + packed draft)
    row_bytes: int               # mla/mha: bytes per token per layer (per K or V); dsa_indexer: bytes per page per layer
    buffers: tuple[Buffer, ...]  # mla / dsa_indexer: (buffer,); mha: (K, V)
    draft_layers: int = 0
    v_row_bytes: int = 0         # mha: V row bytes when it differs from K (refused)
    unified_page_bytes: int = 0  # page_unified: bytes of one page block


@dataclass(frozen=True)
class PoolPlan:
    geometry: PoolGeometry
    layout: PageLayout
    page_bytes: int
    fmt: PoolFormat

    @property
    def num_pages(self) -> int:
        return self.layout.num_pages

    def pages(self, host_indices: np.ndarray, n: int) -> list[int] | None:
        """Page index of each of ``n`` storage pages in ``host_indices`` (token slots, ``n * page_size`` of them),
        or None when the indices are not ``n`` whole, in-range host pages (the call is then refused: a miss or a
        dropped write, never a copy to a wrong place)."""
        ps = self.geometry.page_size
        if n <= 0 or host_indices.ndim != 1 or host_indices.shape[0] != n * ps:
            return None
        rows = host_indices.reshape(n, ps)
        starts = rows[:, 0]
        if ps > 1 and not ((rows - starts[:, None]) == _ARANGE.get(ps)).all():
            return None
        if starts.min() < 0 or np.any(starts % ps):
            return None
        pages = starts // ps
        if pages.max() >= self.layout.num_pages:
            return None
        return pages.tolist()

    def spans(self, page: int) -> list[tuple[int, int]]:
        """(address, length) of each slice of ``page``, in payload order (used to check SGLang's own pointers)."""
        return [(s.region.address + s.offset + page * s.stride, s.length) for s in self.layout.slices]


class _Aranges(dict):
    def get(self, ps):  # noqa: D401 - tiny cache of np.arange(ps)[None, :]
        a = super().get(ps)
        if a is None:
            a = self[ps] = np.arange(ps, dtype=np.int64)[None, :]
        return a


_ARANGE = _Aranges()


def _expect(cond: bool, g: PoolGeometry, what: str) -> None:
    if not cond:
        raise LayoutRefused(f"host pool {g.name!r} ({g.family}, {g.layout}): {what}")


def plan_pool(g: PoolGeometry) -> PoolPlan:
    """Decide how one host pool's pages map to L3 payloads. Raises LayoutRefused with the reason."""
    verdict, why = decision(g.family, g.layout)
    if verdict != SERVED:
        raise LayoutRefused(f"host pool {g.name!r} ({g.family}) in layout {g.layout!r} is not served by L3: {why}")
    _expect(g.page_size > 0 and g.num_pages > 0 and g.layers > 0 and g.row_bytes > 0, g, "empty geometry")
    ps, n, L, row = g.page_size, g.num_pages, g.layers, g.row_bytes
    bufs = [(b.address, b.nbytes) for b in g.buffers]
    if g.family == "mla":
        _expect(len(bufs) == 1, g, f"expected one host buffer, got {len(bufs)}")
        _expect(bufs[0][1] == n * ps * L * row, g,
                f"buffer has {bufs[0][1]} B, geometry says {n}x{ps}x{L}x{row} B")
        if g.layout == "layer_first":
            layout = PageLayout.layer_first(bufs[0], n_layers=L, slice_bytes=ps * row, num_pages=n)
        else:
            layout = PageLayout.page_first(bufs[0], page_bytes=ps * L * row, num_pages=n)
        detail = f"row={row}"
    elif g.family == "dsa_indexer":
        _expect(len(bufs) == 1, g, f"expected one host buffer, got {len(bufs)}")
        _expect(bufs[0][1] == n * L * row, g, f"buffer has {bufs[0][1]} B, geometry says {n}x{L}x{row} B")
        layout = PageLayout.for_dsa_indexer(bufs[0], n_layers=L, page_stride=row, num_pages=n,
                                            page_first=g.layout != "layer_first")
        detail = f"page_stride={row}"
    elif g.family == "mha":
        _expect(not g.v_row_bytes or g.v_row_bytes == row, g,
                "K and V rows differ in width (asymmetric MHA host pool); not served")
        if g.layout == "page_unified":
            _expect(len(bufs) == 1 and g.unified_page_bytes > 0, g, "expected one page_unified block buffer")
            _expect(bufs[0][1] == n * g.unified_page_bytes, g, "page_unified buffer size disagrees with its pages")
            layout = PageLayout.page_first(bufs[0], page_bytes=g.unified_page_bytes, num_pages=n)
        else:
            _expect(len(bufs) == 2, g, f"expected K and V buffers, got {len(bufs)}")
            each = n * ps * L * row
            _expect(all(b[1] == each for b in bufs), g, f"K/V buffers are not {each} B each")
            if g.layout == "layer_first":
                layout = PageLayout.layer_first(bufs, n_layers=2 * L, slice_bytes=ps * row, num_pages=n,
                                                layers_per_buffer=[L, L])
            else:  # page_first, page_first_direct, page_head: one block per page in each of K and V
                layout = PageLayout.layer_first(bufs, n_layers=2, slice_bytes=ps * L * row, num_pages=n,
                                                layers_per_buffer=[1, 1])
        detail = f"row={row}"
    else:  # pragma: no cover - decision() refuses unknown families
        raise LayoutRefused(f"unknown pool family {g.family!r}")
    fmt = PoolFormat(pool=g.name, family=g.family, layout=g.layout, page_bytes=layout.page_bytes, layers=L,
                     draft_layers=g.draft_layers, detail=detail)
    return PoolPlan(g, layout, layout.page_bytes, fmt)
