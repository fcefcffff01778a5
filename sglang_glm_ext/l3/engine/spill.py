"""A spill call: plan (the payload kind, the keys, which pages are durable already, how a page reaches its staging
buffer), then run (admit, copy into staging, queue; answer each page) with no decision left. It only copies and
queues: it never touches a slot pool and never blocks on the disk, except, when asked, for room (``wait``) or for
durability (``durable``), both bounded by ``wait`` seconds for the whole call. ``SharedStore.spill`` states the
promise; a failure anywhere is pages dropped plus a counter, never an exception."""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Callable

import numpy as np

from ..disk.aligned import page_array
from ..disk.format import PAYLOAD_OFFSET, PayloadKind
from .messages import Admission
from .reload import content_hashes, layout_mismatch

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class SpillPlan:
    """What a spill call decided before it stages anything: per page its content hash and index key (None: bad
    input), whether it is durable already (dedup), and ``fill(i, buf, dst)``, which copies page i into staging."""

    kind: PayloadKind
    page_bytes: int
    hashes: list
    ikeys: list
    durable: list
    fill: Callable[[int, Any, np.ndarray], None]


def spill(s, kind, keys, pages, layout, page_indices, wait: float = 0.0, durable_ack: bool = False) -> list[bool]:
    """One spill call on store ``s`` (``pages`` given, or gathered from ``layout`` at ``page_indices``); the
    per-page answers. Its one error net: a failure part-way drops the call's remaining pages."""
    out: list[bool] = []
    queued = [0]  # pages this call queued and has not woken the writer for
    try:
        keys = list(keys)  # any iterable; None or a non-iterable is caught below like any bad input
        out = [False] * len(keys)
        kind = PayloadKind.parse(kind)
        st = s.kinds[kind]
        if s.closed:
            return out
        p = plan(s, kind, st, keys, pages, layout, page_indices)
        if p is not None:
            run(s, p, out, queued, wait, durable_ack)
    except Exception:
        log.exception("L3 spill failed; pages dropped")
        s.c.data_path_errors += 1
    finally:
        if queued[0]:  # also after a failure part-way: what was queued must not wait for the next call
            s.staged.wake()
    return out


def plan(s, kind: PayloadKind, st, keys: list, pages, layout, page_indices) -> "SpillPlan | None":
    """Keys, what is durable already (one index read), and how a page reaches its staging buffer; None when the
    whole call is refused (a layout of another page size: counted and logged once)."""
    hashes = content_hashes(keys)
    ikeys = [s.ikey(kind, h) if h is not None else None for h in hashes]
    present = iter(s.index.get_many([k for k in ikeys if k is not None]))
    durable = [next(present) is not None if k is not None else False for k in ikeys]
    # A page freed and not yet deleted by the writer is no dedup: its entry is about to go.
    freed = s.staged.freed(kind, [h for h in hashes if h is not None]) if s.staged.free_pending else ()
    if any(freed):
        it = iter(freed)
        durable = [d and not next(it) if h is not None else d for d, h in zip(durable, hashes)]
    pb = st.page_bytes  # the writer's seal_blob zeroes the pad and writes the header
    if layout is None:
        def fill(i: int, buf, dst: np.ndarray) -> None:
            src = page_array(pages[i], writable=False)
            if src.nbytes != pb:
                raise ValueError(f"page {i} has {src.nbytes} B, expected {pb}")
            np.copyto(dst[PAYLOAD_OFFSET:PAYLOAD_OFFSET + pb], src)
    else:
        refused = layout_mismatch(st, layout)
        if refused:
            # Every page of the call is bad input: a smaller layout would leave stale staging bytes inside the
            # sealed payload (a wrong page made durable), a larger one would not fit the slot.
            s.c.dropped_bad_input += len(keys)
            s.warn_once("bad_layout", "L3 spill: source refused (%s); the pages are dropped", refused)
            return None

        def fill(i: int, buf, dst: np.ndarray) -> None:
            layout.gather_into(page_indices[i], buf.view, PAYLOAD_OFFSET)
    return SpillPlan(kind, pb, hashes, ikeys, durable, fill)


def run(s, p: SpillPlan, out: list, queued: list, wait: float, durable_ack: bool) -> None:
    """Stage and queue each page of the plan, answering in ``out``; ``queued[0]`` counts what awaits a wake."""
    c, staged, staging, kind = s.c, s.staged, s.staging, p.kind
    deadline = time.monotonic() + wait if wait > 0 else 0.0
    waits: list[tuple[int, Any]] = []  # ack = durable: (page, its staged copy) answered once finished
    for i, h in enumerate(p.hashes):
        if h is None:
            c.dropped_bad_input += 1
            continue
        if p.durable[i]:
            c.dedup += 1
            out[i] = True
            continue
        admitted, buf = _admit(s, kind, h, deadline, queued)
        if admitted is Admission.DEDUP:
            c.dedup += 1
            answer_dedup(s, kind, h, p.ikeys[i], i, out, waits, durable_ack)
            continue
        if buf is None:
            c.dropped_staging += 1
            continue
        try:
            p.fill(i, buf, np.frombuffer(buf.view, dtype=np.uint8))
        except Exception:
            staging.release(kind, buf)
            c.dropped_bad_input += 1
            continue
        page = staged.enqueue(kind, h, p.ikeys[i], buf, acked=not durable_ack, nbytes=p.page_bytes)
        if page is None:  # raced with another spiller of the same page
            c.dedup += 1
            answer_dedup(s, kind, h, p.ikeys[i], i, out, waits, durable_ack)
            continue
        queued[0] += 1
        if durable_ack:
            waits.append((i, page))
        else:
            out[i] = True
    if waits:
        if queued[0]:
            staged.wake()
            queued[0] = 0
        staged.wait_finished([pg for _, pg in waits], deadline or time.monotonic())
        for i, pg in waits:
            out[i] = pg.finished and pg.durable
    c.spill_accepted += sum(out)


def _admit(s, kind: PayloadKind, h: bytes, deadline: float, queued: list):
    """(admission, staging buffer or None) for one page: staging (bytes or in-flight pages) full waits for room
    until ``deadline`` if the caller may wait, else the page is dropped."""
    buf = None
    while True:
        admitted = s.staged.admit(kind, h)
        if admitted is Admission.STAGE:
            buf = s.staging.acquire(kind)
            if buf is not None:
                break
        elif admitted is Admission.DEDUP:
            break
        if not deadline or s.closed:
            break
        if queued[0]:
            s.staged.wake()  # what this call queued must drain first
        if not s.staged.wait_room(deadline):
            break
    return admitted, buf


def answer_dedup(s, kind, h: bytes, ikey: bytes, i: int, out: list, waits: list, durable_ack: bool) -> None:
    """A page another spill staged already: accepted (write-behind), or answered with that copy (durable)."""
    if not durable_ack:
        out[i] = True
        return
    with s.staged.cond:
        page = s.staged.find(kind, h)
    if page is not None and not page.cancelled:
        waits.append((i, page))
    else:  # finished meanwhile: durable if its entry is there
        out[i] = s.index.get(ikey) is not None
