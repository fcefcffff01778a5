"""gpu_bringup's part of `doctor`: `hardware.gpu_bringup`, whether the GPU bring-up tier is on and may run here.

Keys: `mode` ("on" / "off": SGLANG_GLM_EXT_GPU_BRINGUP), `may_run` (bool), `why_not` ('' or the one line a launch
would refuse with), `standin_reachable` (whether `import sgl_kernel` reaches the stand-in in this process),
`real_sgl_kernel` ('' or its path), `missing_settings` (SGLang settings the tier needs that are not set),
`indexer_torch_path` (whether GLM-5's DSA indexer is set to its torch path, needed without deep_gemm).
A problem (exit 1) only when the tier is on and cannot run.
"""

from __future__ import annotations

import os

from .. import declare
from ..declare import DoctorInput, DoctorPart, DoctorReporter
from . import gate
from .feature import GPU_BRINGUP, INDEXER_TORCH


def report(inp: DoctorInput) -> DoctorPart:
    on = gate.mode_on()
    why = gate.refusal_reason() if on else ""
    info = {
        "mode": "on" if on else "off",
        "may_run": on and not why,
        "why_not": why if on else f"{GPU_BRINGUP.name} is not set",
        "standin_reachable": gate.standin_reachable(),
        "real_sgl_kernel": declare.real_sgl_kernel() if on else "",
        "missing_settings": gate.missing_settings() if on else [],
        "indexer_torch_path": os.environ.get(INDEXER_TORCH[0]) == INDEXER_TORCH[1],
    }
    problems = (f"{GPU_BRINGUP.name}=1 refused: {why}",) if why else ()
    return DoctorPart({"gpu_bringup": info}, problems)


def render(hardware, sections) -> list[str]:
    """doctor's text line for `gpu_bringup`."""
    g = hardware.get("gpu_bringup") or {}
    if not g:
        return []
    line = f"  GPU bring-up tier ({GPU_BRINGUP.name}): {g['mode']}"
    if g["may_run"]:
        line += f"; may run here, sgl_kernel stand-in reachable: {g['standin_reachable']}"
        if not g["indexer_torch_path"]:
            line += f" (GLM-5 without deep_gemm also needs {INDEXER_TORCH[0]}={INDEXER_TORCH[1]})"
    elif g["mode"] == "on":
        line += "; " + g["why_not"]
    return [line]


REPORTER = DoctorReporter(report, render, hardware=("gpu_bringup",))
