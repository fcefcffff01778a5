"""How one slot's bytes reach a page's destination: which file ranges go straight into the caller's memory
(O_DIRECT) and which through a small bounce buffer. Pure arithmetic, no I/O (slab_reader.py runs a plan).

A v2 slot is ``[payload | pad | header]`` (format.py). A page's destination is a list of spans (address, length)
in payload order: one for a page-first page, one per layer for a layer-first page. Under alignment
``(mem, offset)`` (dio_align.py) a span's bytes ``[s, e)`` of the payload can go direct exactly for the
offset-aligned interior ``[round_up(s, offset), round_down(e, offset))``, and only if the address that interior
starts at is mem-aligned; everything else -- a span's unaligned head and tail, a span whose address does not fit,
the pad and the header -- is read into the bounce buffer and copied out. The file is read in ONE pass over
``[0, slot_bytes)`` (one ``preadv``, or a few where there are more segments than IOV_MAX), so every segment
boundary is an offset-aligned file position and every segment length a multiple of ``offset``.

Invariant: the direct segments and the copies write exactly the destination spans' own bytes, each once; bytes
that are not the payload (pad, header) never leave the bounce buffer. So a destination's neighbours are never
touched, whatever the alignment.

``vectored=False`` is the single-transfer plan: the whole slot into the bounce buffer, then every span copied
out (the v1 read path). The bench measures both for layer-first pages (seed 487-497: the fork found single
transfers faster; reload.py keeps what measured faster here).
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Sequence

from .dio_align import DioAlignment
from .format import HEADER_SIZE, PAYLOAD_OFFSET

__all__ = ["ReadPlan", "plan_read", "period"]


class ReadPlan(NamedTuple):
    """``segments`` in file order, each ``(span, offset_in_span, -1, n)`` (direct) or ``(-1, 0, bounce_offset, n)``;
    ``copies``: ``(span, offset_in_span, bounce_offset, n)``; the header is at ``bounce[trailer_at:+HEADER_SIZE]``;
    the bounce buffer needs ``bounce_bytes`` (its address mem-aligned)."""

    segments: tuple
    copies: tuple
    trailer_at: int
    bounce_bytes: int
    direct_bytes: int  # payload bytes the plan reads straight into the destination
    payload_bytes: int
    align: DioAlignment  # what the plan was made for (a reader that falls back re-plans)
    span_segments: "tuple | None"  # where each span is exactly one direct segment: those segments' indices, in
    #                                span order (the checksum then runs over the read's own views); else None
    tail: "tuple | None"  # where those are the plan's first segments (the spans, whole, then bounce only): the
    #                       segments after them (pad and header), so a reader builds the spans' views in one go
    packed: "int | None" = None  # where every span is copied whole from the bounce buffer, in order, back to back
    #                              (a single-transfer plan): the bounce offset of the first, so a reader whose spans
    #                              are evenly spaced copies them in one strided copy; else None


def _up(n: int, a: int) -> int:
    return -(-n // a) * a


@functools.lru_cache(maxsize=4096)
def plan_read(lengths: tuple, mods: tuple, slot_bytes: int, align: DioAlignment, vectored: bool) -> ReadPlan:
    """The plan for spans of ``lengths`` whose addresses are ``mods`` modulo ``align.mem`` (the plan depends on
    nothing else, so pages of one layout share it). ``sum(lengths)`` is the payload length."""
    mem, blk = align.mem, align.offset
    payload = sum(lengths)
    if PAYLOAD_OFFSET + payload > slot_bytes - HEADER_SIZE or slot_bytes % blk:
        raise ValueError(f"{payload} B payload does not fit a {slot_bytes} B slot read in {blk} B blocks")
    direct: list[tuple[int, int, int, int]] = []  # (file_start, span, offset_in_span, n)
    bounced: list[tuple[int, int, int, int]] = []  # (file_start, span, offset_in_span, n): span bytes via bounce
    s = PAYLOAD_OFFSET
    for i, (n, mod) in enumerate(zip(lengths, mods)):
        e = s + n
        d0, d1 = _up(s, blk), e // blk * blk
        if vectored and d1 > d0 and (mod + d0 - s) % mem == 0:
            if d0 > s:
                bounced.append((s, i, 0, d0 - s))
            direct.append((d0, i, d0 - s, d1 - d0))
            if e > d1:
                bounced.append((d1, i, d1 - s, e - d1))
        else:
            bounced.append((s, i, 0, n))
        s = e
    # Bounce regions: the file ranges between direct segments, each at a mem-aligned place in the bounce buffer.
    segments, regions, pos, at = [], [], 0, 0
    for start, i, off, n in direct + [(slot_bytes, -1, 0, 0)]:
        if start > pos:
            regions.append((pos, start, at))
            segments.append((-1, 0, at, start - pos))
            at = _up(at + start - pos, mem)
        if n:
            segments.append((i, off, -1, n))
            pos = start + n
    copies, r = [], 0
    for start, i, off, n in bounced:
        while not regions[r][0] <= start < regions[r][1]:
            r += 1
        copies.append((i, off, regions[r][2] + start - regions[r][0], n))
    last = regions[-1]  # the header is after the payload, so never in a direct segment
    whole = tail = None
    if not copies and len(direct) == len(lengths):
        whole = tuple(j for j, seg in enumerate(segments) if seg[0] >= 0)
        if whole[-1] == len(whole) - 1:
            tail = tuple(segments[len(whole):])
    packed = None
    if len(copies) == len(lengths) and all(c[:2] == (i, 0) and c[3] == lengths[i] for i, c in enumerate(copies)) \
            and all(b[2] == a[2] + a[3] for a, b in zip(copies, copies[1:])):
        packed = copies[0][2]
    return ReadPlan(tuple(segments), tuple(copies), last[2] + slot_bytes - HEADER_SIZE - last[0], max(at, mem),
                    sum(d[3] for d in direct), payload, align, whole, tail, packed)


def period(strides: Sequence[int], mem: int) -> int:
    """Pages ``p`` and ``p + period`` of a layout with these per-slice strides have the same addresses modulo
    ``mem`` (so the same plan): the lcm over slices of ``mem / gcd(stride, mem)``. 1 when every stride is a
    multiple of ``mem`` (GLM-5's 41,984 B layer chunks and 3,274,752 B pages under 512 B alignment)."""
    import math

    out = 1
    for st in strides:
        out = math.lcm(out, mem // math.gcd(st, mem))
    return out
