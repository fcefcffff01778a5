"""Whether a configured L3 path can take O_DIRECT writes and has room for its budget (used by `doctor`)."""

from __future__ import annotations

import errno
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


def probe_path(path: str, budget_bytes: int | None = None) -> dict[str, Any]:
    row: dict[str, Any] = {"path": path, "exists": os.path.isdir(path), "budget_bytes": budget_bytes,
                           "problems": []}
    probe_dir = path
    while probe_dir and not os.path.isdir(probe_dir):  # a not-yet-created path: check where it would live
        probe_dir = os.path.dirname(probe_dir.rstrip("/")) or "/"
    st = os.statvfs(probe_dir)
    row["free_bytes"] = st.f_bavail * st.f_frsize
    ok, why = o_direct_works(probe_dir)
    row["o_direct"], row["o_direct_detail"] = ok, why
    if not os.access(probe_dir, os.W_OK):
        row["problems"].append(f"L3 path {path}: not writable")
    if budget_bytes and not row["exists"] and budget_bytes > row["free_bytes"]:
        row["problems"].append(
            f"L3 path {path}: budget {budget_bytes} B exceeds free space {row['free_bytes']} B")
    return row
