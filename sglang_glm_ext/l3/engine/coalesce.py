"""Which of a reload call's page reads go to the disk together, and in what order: a pure function, no I/O.

Pages of one call whose slots are adjacent in one slab come off the disk in one transfer (a prefix spilled together
lands in consecutive slots: the slot pool hands out the lowest free slot first); a transfer pays the kernel's O_DIRECT
set-up and the read's Python calls once for all its pages. :func:`coalesce` groups such pages, in slot order, into
units of at most ``read_coalesce_bytes``, cut so every reader gets an equal share; the read path
(``engine/reload.py``) reads each unit in one transfer (``SlabReader.read_run``) or page by page where it cannot.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

__all__ = ["Place", "coalesce"]


class Place(NamedTuple):
    """Where a page's blob is: a slot of the slab of (rank, disk). An ``IndexEntry`` has the same three fields and
    may stand for it."""
    rank: int
    disk: int
    slot: int


def coalesce(places: Sequence["Place | None"], *, slot_bytes: int, coalesce_bytes: int,
             readers: int) -> "list[list[int]]":
    """The call's reads as units, in the order the readers take them: each unit lists positions in ``places``.
    ``places[j]`` is where page j's blob is (anything with ``rank``, ``disk``, ``slot``), or None for a page that
    does not come from a slab (a staged copy): a unit of its own, after every slab unit, in call order.

    Pages in adjacent slots of one (rank, disk) form a run, in slot order; two pages naming one slot are never
    adjacent. With R readers (``readers``, at most one a page) every reader gets at least two units (a read in flight
    while the unit before it is hashed, also with one reader), and each run is split into near-equal pieces of at
    most n / (R * m) pages, m = the units a reader needs at the byte cap (``coalesce_bytes // slot_bytes`` pages):
    128 pages at a cap of 7 (8 MiB of 1 MiB pages) and 8 readers are 24 units of 5-6 pages, 16 pages a reader (whole
    runs at the cap, 19 units, left two readers 21 pages and the others 14, while the call waits for its last).
    Largest first, then slot order: readers take the next unit whenever they are free, so a slow read holds back only
    its own unit and the units left for the end are the short ones. Where a unit would be one page anyway (a cap under
    two pages, too few pages for two units a reader), every slab page is a unit of its own, in slot order."""
    slab = sorted((p.rank, p.disk, p.slot, j) for j, p in enumerate(places) if p is not None)
    staged = [[j] for j, p in enumerate(places) if p is None]
    n = len(slab)
    readers = max(1, min(readers, n))
    cap = coalesce_bytes // slot_bytes
    shares = readers * max(2, -(-n // (readers * max(cap, 1))))  # units at the cap, two a reader at least
    if cap < 2 or n < 2 * shares:
        return [[j] for *_, j in slab] + staged
    units = [piece for run in _runs(slab) for piece in _split(run, -(-len(run) * shares // n))]
    units.sort(key=len, reverse=True)  # stable: equal sizes stay in slot order
    return units + staged


def _runs(slab: list) -> "list[list[int]]":
    """Sorted ``(rank, disk, slot, position)`` rows as runs of positions whose slots follow each other."""
    runs: list[list[int]] = []
    prev = None
    for rank, disk, slot, j in slab:
        if runs and prev == (rank, disk, slot - 1):
            runs[-1].append(j)
        else:
            runs.append([j])
        prev = (rank, disk, slot)
    return runs


def _split(run: list, k: int) -> "list[list[int]]":
    """``run`` in ``k`` consecutive pieces whose sizes differ by at most one, the larger first."""
    base, extra = divmod(len(run), k)
    out, at = [], 0
    for q in range(k):
        size = base + (q < extra)
        out.append(run[at:at + size])
        at += size
    return out
