"""host memory's part of `doctor`: the node's hugepages (what a hugepage-backed host KV pool could use)."""

from __future__ import annotations

from typing import Any

from ..declare import DoctorInput, DoctorPart


def report(inp: DoctorInput) -> DoctorPart:
    return DoctorPart({"hugepages": hugepages()})


def hugepages(meminfo: str = "/proc/meminfo", mounts: str = "/proc/mounts") -> dict[str, Any]:
    info: dict[str, Any] = {"total": 0, "free": 0, "size_kb": 0, "mounts": []}
    try:
        with open(meminfo) as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key == "HugePages_Total":
                    info["total"] = int(rest.split()[0])
                elif key == "HugePages_Free":
                    info["free"] = int(rest.split()[0])
                elif key == "Hugepagesize":
                    info["size_kb"] = int(rest.split()[0])
        with open(mounts) as f:
            info["mounts"] = [ln.split()[1] for ln in f if ln.split()[2:3] == ["hugetlbfs"]]
    except OSError:
        pass
    return info
