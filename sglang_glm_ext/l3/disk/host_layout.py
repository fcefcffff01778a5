"""Where a page's bytes live in host memory, and the copies between that and a contiguous blob payload.

A host KV pool is described as a list of slices: page ``p`` consists of slice ``i`` at
``base_i + p * stride_i`` (``length_i`` bytes), concatenated in slice order to form the blob payload.

* page-first (SGLang ``page_first`` / ``page_first_direct``): one slice, the whole page is contiguous, so a
  gather/scatter is one memmove, no extra pass.
* layer-first (SGLang ``layer_first``, MLA ``(L, size, 1, D)``, DSA indexer ``(L, pages, stride)``): one slice per
  layer, layer ``l``'s region may sit in a different buffer when the host cache is split over several buffers.

The payload order therefore depends on the layout (layer-major vs token-major), which is why the layout name is
part of ``format.Namespace``.

Reloads do not copy through this module: :meth:`PageLayout.page_spans` hands the read path (reload.py) page ``p``'s
slices as writable views, and :meth:`PageLayout.read_plan` the plan (read_plan.py) that reads a slot straight into
them with O_DIRECT; pages whose addresses agree modulo the alignment share one plan, cached here.

No torch: buffers are buffer-protocol objects (numpy arrays, memoryviews, mmaps, AlignedBuffer) or
``(address, nbytes)`` pairs such as ``(tensor.data_ptr(), tensor.nbytes)``. With raw addresses the caller keeps the
memory alive; with objects this layout holds a reference. Copies use ctypes.memmove, which releases the GIL.
"""

from __future__ import annotations

import ctypes
import itertools
import operator
from dataclasses import dataclass
from typing import NamedTuple, Sequence

from .aligned import AlignedBuffer, buffer_address
from .dio_align import DioAlignment
from .read_plan import ReadPlan, period, plan_read


@dataclass(frozen=True)
class _Region:
    address: int
    nbytes: int
    writable: bool
    owner: object  # keeps a buffer object alive while the layout uses its address


def _region(buf) -> _Region:
    if isinstance(buf, tuple):
        if len(buf) != 2 or not all(isinstance(x, int) and x >= 0 for x in buf) or buf[0] == 0:
            raise ValueError(f"raw buffer must be (address, nbytes) with a non-null address, got {buf!r}")
        return _Region(buf[0], buf[1], True, None)
    if isinstance(buf, AlignedBuffer):
        return _Region(buf.address, buf.size, True, buf)
    view = memoryview(buf)
    if not view.c_contiguous:
        raise ValueError("host buffer must be C-contiguous")
    return _Region(buffer_address(view.cast("B") if view.ndim != 1 or view.format != "B" else view),
                   view.nbytes, not view.readonly, buf)


class PageSpans(NamedTuple):
    """One page's destination as the read path sees it: span ``i`` is ``views[i][starts[i]:starts[i] + lengths[i]]``
    (writable), at address ``bases[i] + starts[i]``; spans in payload order."""

    views: Sequence[memoryview]
    bases: Sequence[int]
    starts: Sequence[int]
    lengths: tuple
    same: "slice | None" = None  # every span is views[i][same] (one start, one length): the pieces in one C loop
    grid: "tuple | None" = None  # (view, spacing): the spans are also view[same.start + i * spacing:][:length], all
    #                             in one buffer at one spacing (layer-first in one buffer): one strided copy fills them

    def pieces(self) -> list:
        """The spans as views, in payload order (what the checksum runs over)."""
        if self.same is not None:  # layer-first: 64-78 spans a page, one slice object for all (~2x the comprehension)
            return list(map(operator.getitem, self.views, itertools.repeat(self.same, len(self.views))))
        return [v[s:s + n] for v, s, n in zip(self.views, self.starts, self.lengths)]

    def head(self, n: int) -> bytes:
        """The payload's first ``n`` bytes (a v1 header, if the slot holds one)."""
        out = bytearray()
        for v, s, ln in zip(self.views, self.starts, self.lengths):
            out += v[s:s + min(ln, n - len(out))]
            if len(out) >= n:
                break
        return bytes(out)

    @classmethod
    def flat(cls, view: memoryview, nbytes: int) -> "PageSpans":
        """A contiguous destination (``reload_into``): its first ``nbytes``."""
        return cls((view,), (buffer_address(view),), (0,), (nbytes,), slice(0, nbytes))


def _writable_view(address: int, nbytes: int) -> memoryview:
    """A flat byte view of memory the caller keeps alive (the layout holds buffer objects; raw addresses are the
    caller's)."""
    return memoryview((ctypes.c_ubyte * nbytes).from_address(address)).cast("B")


@dataclass(frozen=True)
class Slice:
    """Slice ``i`` of page ``p`` is ``length`` bytes at ``region.address + offset + p * stride``."""

    region: _Region
    offset: int
    stride: int
    length: int


class PageLayout:
    """Invariant (checked at construction): every slice of every page ``0 <= p < num_pages`` lies inside its buffer,
    so gather/scatter can never touch memory outside the pool; a page index outside the range raises IndexError."""

    def __init__(self, slices: Sequence[Slice], num_pages: int) -> None:
        if not slices:
            raise ValueError("a page layout needs at least one slice")
        if not isinstance(num_pages, int) or num_pages <= 0:
            raise ValueError(f"num_pages must be a positive int, got {num_pages!r}")
        for i, s in enumerate(slices):
            if s.offset < 0 or s.stride < 0 or s.length <= 0:
                raise ValueError(f"slice {i}: offset/stride must be >= 0 and length > 0")
            end = s.offset + (num_pages - 1) * s.stride + s.length
            if end > s.region.nbytes:
                raise ValueError(f"slice {i}: page {num_pages - 1} ends at byte {end} but its buffer has "
                                 f"{s.region.nbytes} B")
        self.slices = tuple(slices)
        self.num_pages = num_pages
        self.page_bytes = sum(s.length for s in slices)
        # (base address, stride, length, payload offset) with no attribute lookups left for the hot path
        plan, at = [], 0
        for s in self.slices:
            plan.append((s.region.address + s.offset, s.stride, s.length, at))
            at += s.length
        self._plan = tuple(plan)
        self._writable = all(s.region.writable for s in self.slices)
        self._strides = tuple(s.stride for s in self.slices)
        self._lengths = tuple(s.length for s in self.slices)
        self._bases = tuple(addr for addr, _, _, _ in plan)
        # One stride and one length for every slice (page-first; layer-first in one or several buffers): page p's
        # spans all start at p * stride of their slice's view, so PageSpans can name them with one slice.
        self._same = (self._strides[0], self._lengths[0]) if len(set(self._strides)) == 1 == len(set(self._lengths)) \
            else None
        self._views: "tuple[memoryview, ...] | None" = None  # made at the first read (reloads only)
        self._grid: "tuple | None" = None  # PageSpans.grid, made with _views where the slices allow one
        self._read_plans: dict = {}

    # ------------------------------------------------------------------ factories
    @classmethod
    def page_first(cls, buf, *, page_bytes: int, num_pages: int, offset: int = 0) -> "PageLayout":
        """One contiguous block per page (SGLang page_first / page_first_direct)."""
        return cls([Slice(_region(buf), offset, page_bytes, page_bytes)], num_pages)

    @classmethod
    def layer_first(cls, bufs, *, n_layers: int, slice_bytes: int, num_pages: int,
                    layers_per_buffer: "Sequence[int] | None" = None) -> "PageLayout":
        """Layer ``l`` of page ``p`` at ``layer_base_l + p * slice_bytes``; each layer region holds ``num_pages``.

        ``bufs`` is one buffer holding all layers back to back, or several buffers each holding a run of whole
        layers in order (``layers_per_buffer``; inferred from buffer sizes when omitted).
        """
        bufs = list(bufs) if isinstance(bufs, (list, tuple)) and not _is_raw(bufs) else [bufs]
        regions = [_region(b) for b in bufs]
        layer_bytes = slice_bytes * num_pages
        if layers_per_buffer is None:
            if len(regions) == 1:
                layers_per_buffer = [n_layers]
            else:
                if any(r.nbytes % layer_bytes for r in regions):
                    raise ValueError("cannot infer layers per buffer: a buffer is not a whole number of layers; "
                                     "pass layers_per_buffer")
                layers_per_buffer = [r.nbytes // layer_bytes for r in regions]
        if len(layers_per_buffer) != len(regions) or sum(layers_per_buffer) != n_layers:
            raise ValueError(f"layers_per_buffer {list(layers_per_buffer)} does not cover {n_layers} layers "
                             f"over {len(regions)} buffers")
        slices = []
        for region, count in zip(regions, layers_per_buffer):
            slices.extend(Slice(region, j * layer_bytes, slice_bytes, slice_bytes) for j in range(count))
        return cls(slices, num_pages)

    @classmethod
    def for_mla_layer_first(cls, bufs, *, n_layers: int, page_size: int, kv_cache_dim: int, itemsize: int,
                            num_pages: int, layers_per_buffer=None) -> "PageLayout":
        """SGLang MLA host pool, layer_first ``(L, num_pages*page_size, 1, kv_cache_dim)``.

        GLM-5: 78 layers x 64 tokens x 656 B = 3,274,752 B per page.
        """
        return cls.layer_first(bufs, n_layers=n_layers, slice_bytes=page_size * kv_cache_dim * itemsize,
                               num_pages=num_pages, layers_per_buffer=layers_per_buffer)

    @classmethod
    def for_mla_page_first(cls, buf, *, n_layers: int, page_size: int, kv_cache_dim: int, itemsize: int,
                           num_pages: int) -> "PageLayout":
        """SGLang MLA host pool, page_first ``(size, L, 1, D)`` or page_first_direct ``(pages, L, page_size, 1, D)``:
        either way a page is ``page_size * L * D * itemsize`` contiguous bytes."""
        return cls.page_first(buf, page_bytes=page_size * n_layers * kv_cache_dim * itemsize, num_pages=num_pages)

    @classmethod
    def for_dsa_indexer(cls, bufs, *, n_layers: int, page_stride: int, num_pages: int,
                        page_first: bool = False, layers_per_buffer=None) -> "PageLayout":
        """SGLang DSA indexer host pool: layer_first ``(L, pages, stride)`` or page_first ``(pages, L, 1, stride)``.

        ``page_stride`` is one layer's bytes of one indexer page (k + scales for page_size tokens).
        """
        if page_first:
            return cls.page_first(bufs, page_bytes=n_layers * page_stride, num_pages=num_pages)
        return cls.layer_first(bufs, n_layers=n_layers, slice_bytes=page_stride, num_pages=num_pages,
                               layers_per_buffer=layers_per_buffer)

    # ------------------------------------------------------------------ copies
    def _check_page(self, page_index: int) -> None:
        if not isinstance(page_index, int) or not 0 <= page_index < self.num_pages:
            raise IndexError(f"page {page_index!r} outside the host pool [0, {self.num_pages})")

    def gather_into(self, page_index: int, dst, dst_offset: int = 0) -> int:
        """Copy page ``page_index`` into ``dst[dst_offset:dst_offset + page_bytes]``; returns page_bytes."""
        self._check_page(page_index)
        out = _region(dst)
        if not out.writable:
            raise ValueError("gather destination is read-only")
        self._check_span(out, dst_offset, "destination")
        base = out.address + dst_offset
        for addr, stride, length, at in self._plan:
            ctypes.memmove(base + at, addr + page_index * stride, length)
        return self.page_bytes

    def scatter_from(self, page_index: int, src, src_offset: int = 0) -> int:
        """Copy ``src[src_offset:src_offset + page_bytes]`` into page ``page_index``; returns page_bytes."""
        self._check_page(page_index)
        if not self._writable:
            raise ValueError("host pool buffer is read-only; cannot scatter into it")
        inp = _region(src)
        self._check_span(inp, src_offset, "source")
        base = inp.address + src_offset
        for addr, stride, length, at in self._plan:
            ctypes.memmove(addr + page_index * stride, base + at, length)
        return self.page_bytes

    # ------------------------------------------------------------------ direct reads
    def page_spans(self, page_index: int) -> PageSpans:
        """Page ``page_index``'s slices as writable views for a direct read (read path only). IndexError outside
        the pool; ValueError for a read-only pool."""
        self._check_page(page_index)
        views = self._views
        if views is None:
            if not self._writable:
                raise ValueError("host pool buffer is read-only; cannot reload into it")
            n = self.num_pages - 1
            views = tuple(_writable_view(base, n * stride + length)
                          for base, stride, length in zip(self._bases, self._strides, self._lengths))
            self._grid = self._make_grid()
            self._views = views
        if self._same is not None:
            stride, length = self._same
            at = page_index * stride
            return PageSpans(views, self._bases, [at] * len(views), self._lengths, slice(at, at + length), self._grid)
        return PageSpans(views, self._bases, [page_index * st for st in self._strides], self._lengths)

    def _make_grid(self) -> "tuple | None":
        """(one writable view from the first slice's start to the last slice's end of the last page, the distance
        between consecutive slices) where every slice has one stride and length, lies in ONE buffer, and the slices
        follow each other at one spacing without overlapping (layer-first in one buffer); else None. Only the
        slices' own bytes are ever written through it (a strided copy of ``length`` bytes per slice)."""
        if self._same is None or len(self.slices) < 2:
            return None
        stride, length = self._same
        region = self.slices[0].region
        gaps = {b - a for a, b in zip(self._bases, self._bases[1:])}
        if len(gaps) != 1 or any(s.region is not region for s in self.slices):
            return None
        gap = gaps.pop()
        if gap < length:
            return None
        span = (len(self.slices) - 1) * gap + (self.num_pages - 1) * stride + length
        return _writable_view(self._bases[0], span), gap

    def read_plan(self, page_index: int, slot_bytes: int, align: DioAlignment, vectored: bool) -> ReadPlan:
        """The read plan for this page's slot (shared by every page with the same addresses modulo ``align.mem``)."""
        mem = align.mem
        per = self._read_plans.get(mem)
        if per is None:
            per = self._read_plans[mem] = period(self._strides, mem)
        key = (page_index % per, slot_bytes, mem, align.offset, vectored)
        plan = self._read_plans.get(key)
        if plan is None:
            mods = tuple((b + page_index * st) % align.mem for b, st in zip(self._bases, self._strides))
            plan = self._read_plans[key] = plan_read(self._lengths, mods, slot_bytes, align, vectored)
        return plan

    def _check_span(self, region: _Region, offset: int, what: str) -> None:
        if offset < 0 or offset + self.page_bytes > region.nbytes:
            raise ValueError(f"{what} of {region.nbytes} B cannot hold a {self.page_bytes} B page at offset {offset}")

    def __repr__(self) -> str:
        return f"PageLayout(slices={len(self.slices)}, page_bytes={self.page_bytes}, num_pages={self.num_pages})"


def _is_raw(obj) -> bool:
    return isinstance(obj, tuple) and len(obj) == 2 and all(isinstance(x, int) for x in obj)
