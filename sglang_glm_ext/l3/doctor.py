"""L3's part of `doctor`: each configured L3 path (exists, O_DIRECT, free space against its budget) under
"hardware", and the top-level "l3" section (backend class, resolved extra config, L3 state on disk; hicache/doctor.py).
"""

from __future__ import annotations

from typing import Any

from ..declare import DoctorInput, DoctorPart
from .feature import CP_L3_CONFIG

__all__ = ["report", "l3_paths", "render_section"]

# The fix doctor shows for each L3 problem (each names the config key or path at fault; the launch refuses it alike).
FIX = ("correct what it names in the --cp-l3-config file or on its disks (a writable directory per [[disks]] entry, "
       "a budget within free space); `sglang-glm-ext l3 example-config --dir DIR` writes a valid config")


def report(inp: DoctorInput) -> DoctorPart:
    from .hicache.doctor import report as backend_report

    rows, problems = l3_paths(inp.values.get(CP_L3_CONFIG.name))
    section, more = backend_report(inp.values)
    problems.extend(p for p in more if p not in problems)  # a bad config is one problem, not one per part
    return DoctorPart({"l3_paths": rows}, tuple(problems), sections={"l3": section}, fix=FIX)


def render_section(section: dict) -> list[str]:
    """The "l3" section as text lines (plugin/doctor.py render_text)."""
    from .hicache.doctor import render

    return render(section)


def l3_paths(config_path: str | None) -> tuple[list[dict[str, Any]], list[str]]:
    if not config_path:
        return [], []
    problems: list[str] = []
    try:
        from .config import L3Config
        from .diskcheck import budget_fit, probe_path
    except ImportError as exc:
        return [], [f"L3 engine not importable: {exc}"]
    try:
        cfg = L3Config.load(config_path)
    except Exception as exc:
        return [], [f"--cp-l3-config {config_path}: {exc}"]
    rows = []
    fit = budget_fit(cfg, config_path)  # what the launch check refuses, in the same words
    for disk, space in zip(cfg.disks, fit):
        row = probe_path(disk.path, disk.budget)
        row.update({k: space[k] for k in ("slab_bytes", "held_bytes", "need_bytes") if k in space})
        if space.get("problem"):
            row["problems"].append(space["problem"])
        rows.append(row)
        problems.extend(row.get("problems", []))
    return rows, problems
