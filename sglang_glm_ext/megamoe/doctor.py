"""MegaMoE's part of `doctor`: which MegaMoE kernels this node and its deep_gemm can run, and why not.

Two `hardware` keys (schema 1; `fp4_megamoe`'s first two keys are the original ones, the rest are additions):
- `fp4_megamoe`: {possible, why} (FP4 kernels are SM100-only, deep_gemm installed), the installed `deep_gemm`
  version, and `trtllm_layout`: {supported, why} (does it read NVFP4 weights on FlashInfer's TRTLLM layout).
- `megamoe`: {fp8_sm90, fp4_sm100: {possible, why}, deep_gemm: {version, imports, error}, retired_env: [names],
  dg_use_fp4_acts_set}.

Problems: a retired fork switch or DG_USE_FP4_ACTS set (either stops a launch), and, when the launch being
checked asks for megamoe (`doctor --moe-a2a-backend megamoe`), a node on which no MegaMoE kernel can run.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Mapping, Sequence

from ..declare import DoctorInput, DoctorPart, Problem
from . import hardware
from .feature import FEATURE


def report(inp: DoctorInput) -> DoctorPart:
    version = inp.versions.get("deep_gemm")
    fp4 = {**fp4_megamoe(inp.gpus, version), "deep_gemm": version, "trtllm_layout": hardware.trtllm_layout()}
    megamoe = hardware.doctor_part(list(inp.gpus))
    problems = hardware.doctor_problems(megamoe)
    node = launch_problems(megamoe)  # no MegaMoE kernel runs here: megamoe is unavailable on this node
    if FEATURE.switched_on(inp.values, SimpleNamespace(**inp.launch)):  # doctor --moe-a2a-backend megamoe
        problems += node
    return DoctorPart({"fp4_megamoe": fp4, "megamoe": megamoe}, tuple(problems),
                      unavailable={FEATURE.name: node[0].removeprefix("--moe-a2a-backend megamoe: ")} if node else {})


def fp4_megamoe(gpu_list: Sequence[Mapping[str, Any]], deep_gemm_version: str | None) -> dict[str, Any]:
    if not gpu_list:
        return {"possible": False, "why": "no CUDA GPU visible"}
    if not all(g["sm"] // 10 == 10 for g in gpu_list):
        sms = sorted({g["sm"] for g in gpu_list})
        return {"possible": False, "why": f"FP4 MegaMoE kernels are SM100-only; this node has SM {sms}"}
    if deep_gemm_version is None:
        return {"possible": False, "why": "deep_gemm is not installed"}
    return {"possible": True, "why": ""}


def launch_problems(part: Mapping[str, Any]) -> list[str]:
    """A megamoe launch on this node: refused at startup unless some MegaMoE kernel can run here."""
    kernels = ("fp8_sm90", "fp4_sm100")
    if any(part[k]["possible"] for k in kernels):
        return []
    return [Problem("--moe-a2a-backend megamoe: no MegaMoE kernel can run on this node (" +
                    "; ".join(f"{k}: {part[k]['why']}" for k in kernels) + ")",
                    fix="serve it on SM90 GPUs (FP8 experts) or SM100 (FP4) with deep_gemm installed, or choose "
                        "another --moe-a2a-backend")]
