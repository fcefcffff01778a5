"""L3's part of `doctor`: each configured L3 path (exists, O_DIRECT, free space against its budget)."""

from __future__ import annotations

from typing import Any

from ..declare import DoctorInput, DoctorPart
from .feature import CP_L3_CONFIG


def report(inp: DoctorInput) -> DoctorPart:
    rows, problems = l3_paths(inp.values.get(CP_L3_CONFIG.name))
    return DoctorPart({"l3_paths": rows}, tuple(problems))


def l3_paths(config_path: str | None) -> tuple[list[dict[str, Any]], list[str]]:
    if not config_path:
        return [], []
    problems: list[str] = []
    try:
        from .config import L3Config
        from .diskcheck import probe_path
    except ImportError as exc:
        return [], [f"L3 engine not importable: {exc}"]
    try:
        cfg = L3Config.load(config_path)
    except Exception as exc:
        return [], [f"--cp-l3-config {config_path}: {exc}"]
    rows = []
    for disk in cfg.disks:
        row = probe_path(disk.path, disk.budget)
        rows.append(row)
        problems.extend(row.get("problems", []))
    return rows, problems
