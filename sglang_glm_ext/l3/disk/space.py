"""Whether a configured L3 path has room for its budget (and whether a directory takes O_DIRECT writes).

One computation of "does the budget fit" (:func:`budget_fit`), used by ``doctor`` and by the launch check
(``launch.plan_launch``, before the model loads): for every file system the config's disks live on, the
slab bytes the budget will preallocate there, minus what this deployment's slabs already hold on it (an existing,
preallocated slab is space already taken, not needed again), must fit in its free space. Whether the engine can
create and write its directories at all is ``probe.py``'s, asked first.
"""

from __future__ import annotations

import errno
import glob
import mmap
import os
import tempfile
from typing import Any


def o_direct_works(directory: str) -> tuple[bool | None, str]:
    """Write one aligned 4 KiB block with O_DIRECT in `directory`. (None, why) when it cannot be tried."""
    if not hasattr(os, "O_DIRECT"):
        return None, "this OS has no O_DIRECT"
    try:
        fd, path = tempfile.mkstemp(prefix=".glm_ext_odirect_", dir=directory)
    except OSError as exc:
        return None, f"cannot create a file: {exc.strerror}"
    os.close(fd)
    try:
        try:
            dfd = os.open(path, os.O_WRONLY | os.O_DIRECT)
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                return False, "O_DIRECT refused (EINVAL; tmpfs or similar): buffered + fdatasync fallback"
            return None, exc.strerror
        try:
            buf = mmap.mmap(-1, 4096)  # page-aligned by construction
            os.pwrite(dfd, buf, 0)
            return True, ""
        except OSError as exc:
            return False, f"O_DIRECT write failed: {exc.strerror}"
        finally:
            os.close(dfd)
    finally:
        os.unlink(path)


def nearest_dir(path: str) -> str:
    """``path`` or its nearest existing ancestor (where a not-yet-created path would live)."""
    p = os.path.abspath(path)
    while not os.path.isdir(p):
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    return p


def free_bytes(path: str) -> int:
    """Bytes an unprivileged writer may still allocate on ``path``'s file system."""
    st = os.statvfs(nearest_dir(path))
    return st.f_bavail * st.f_frsize


def _gib(n: int) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def slab_bytes_held(cfg, disk: int) -> int:
    """Bytes this deployment's slab files already hold on disk ``disk`` (allocated blocks, so a sparse slab counts
    what it really holds), over every rank mapped to it."""
    held = 0
    for rank in cfg.ranks_on_disk(disk):
        for path in glob.glob(os.path.join(glob.escape(cfg.slab_dir(rank, disk)), "*.slab")):
            try:
                held += os.stat(path).st_blocks * 512
            except OSError:
                pass
    return held


def budget_fit(cfg, source: str | None = None) -> list[dict[str, Any]]:
    """One row per configured disk: its budget, what its slabs will take, what this deployment's slabs already hold
    there, the free space of its file system, and ``problem`` ('' when it fits: one line naming the fix otherwise).
    Disks that share a file system are added up (their slabs compete for the same free space)."""
    rows, by_fs = [], {}
    for i, d in enumerate(cfg.disks):
        ranks = cfg.ranks_on_disk(i)
        budget = sum(cfg.rank_budget(r, i) for r in ranks)  # what the ranks mapped to it preallocate at most
        base = nearest_dir(d.path)
        try:
            fs = os.stat(base).st_dev
            free = free_bytes(base)
        except OSError as e:
            rows.append({"disk": i, "path": d.path, "budget_bytes": d.budget, "problem": f"cannot stat {base}: {e}"})
            continue
        held = slab_bytes_held(cfg, i)
        row = {"disk": i, "path": d.path, "budget_bytes": d.budget, "slab_bytes": budget, "held_bytes": held,
               "need_bytes": max(0, budget - held), "free_bytes": free, "problem": ""}
        rows.append(row)
        by_fs.setdefault(fs, []).append(row)
    where = f"--cp-l3-config {source}: " if source else ""
    for group in by_fs.values():
        need = sum(r["need_bytes"] for r in group)
        free = group[0]["free_bytes"]
        if need <= free:
            continue
        for r in group:
            if not r["need_bytes"]:
                continue
            names = ", ".join(f"disks[{g['disk']}]" for g in group)
            shared = f" (shared by {names})" if len(group) > 1 else ""
            cap = r["held_bytes"] + max(0, free - (need - r["need_bytes"]))
            r["problem"] = (
                f"{where}disks[{r['disk']}].budget {_gib(r['budget_bytes'])} does not fit on {r['path']}: its slabs "
                f"need {_gib(r['need_bytes'])} more than the {_gib(r['held_bytes'])} this deployment's slabs already "
                f"hold there, and the file system{shared} has {_gib(free)} free; lower disks[{r['disk']}].budget to "
                f"at most {_gib(cap)} or free space there")
    return rows
