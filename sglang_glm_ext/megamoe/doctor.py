"""MegaMoE's part of `doctor`: whether this node can run the FP4 MegaMoE kernels."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..declare import DoctorInput, DoctorPart


def report(inp: DoctorInput) -> DoctorPart:
    return DoctorPart({"fp4_megamoe": fp4_megamoe(inp.gpus, inp.versions.get("deep_gemm"))})


def fp4_megamoe(gpu_list: Sequence[Mapping[str, Any]], deep_gemm_version: str | None) -> dict[str, Any]:
    if not gpu_list:
        return {"possible": False, "why": "no CUDA GPU visible"}
    if not all(g["sm"] // 10 == 10 for g in gpu_list):
        sms = sorted({g["sm"] for g in gpu_list})
        return {"possible": False, "why": f"FP4 MegaMoE kernels are SM100-only; this node has SM {sms}"}
    if deep_gemm_version is None:
        return {"possible": False, "why": "deep_gemm is not installed"}
    return {"possible": True, "why": ""}
