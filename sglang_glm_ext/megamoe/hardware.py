"""Which MegaMoE kernels this machine can run, and why not: doctor's part, and the facts the startup check uses.

Hardware truth (DeepGEMM, sgl-deep-gemm 0.2.x): the FP4 MegaMoE kernels (fp8xfp4, mxf4xmxf4, nvfp4xnvfp4) and the
bf16 one run on SM100-class GPUs (compute capability 10.x) only; on SM90 the only MegaMoE kernel is block-FP8
(`fp8_mega_moe`, recipe 128x128x128), and `get_symm_buffer_for_mega_moe` asserts an fp8 MMA type there. Nothing
here imports deep_gemm or touches CUDA at import time; `probe_deep_gemm` imports it when asked (the launch
check needs its API names), `deep_gemm_version` and `trtllm_layout` only read the installed files.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from dataclasses import dataclass
from typing import Any, Iterable, Optional

from ..declare import Problem
from .guard import RETIRED_ENV, SM100_KERNEL_API, SM90_KERNEL_API


@dataclass(frozen=True)
class DeepGemmProbe:
    version: Optional[str]
    api: frozenset[str]
    error: str = ""


# sglang pins the `sgl-deep-gemm` distribution; its import name is deep_gemm.
DEEP_GEMM_DISTS = ("sgl-deep-gemm", "deep-gemm", "deep_gemm")


def deep_gemm_version() -> Optional[str]:
    for dist in DEEP_GEMM_DISTS:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def trtllm_layout() -> dict[str, Any]:
    """{"supported": bool, "why": str}: does `fp8_fp4_mega_moe` take `weight_layout="trtllm"` (sgl-deep-gemm
    >= 0.2.3; absent in 0.2.0)? Without it NVFP4 MegaMoE cannot share FlashInfer's TRTLLM tensors.

    Read from the installed source, without importing deep_gemm: its import loads a compiled torch extension
    (and refuses legacy DG_* variables), which a diagnostic must neither pay for nor trip over."""
    try:
        spec = importlib.util.find_spec("deep_gemm")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return {"supported": False, "why": "deep_gemm is not installed"}
    path = os.path.join(list(spec.submodule_search_locations)[0], "mega", "__init__.py")
    try:
        with open(path, encoding="utf-8") as f:
            src = f.read()
    except OSError as exc:
        return {"supported": False, "why": f"cannot read {path}: {exc}"}
    if "weight_layout" in src and "'trtllm'" in src:
        return {"supported": True, "why": ""}
    return {"supported": False, "why": f"deep_gemm {deep_gemm_version()} has no weight_layout='trtllm' "
                                       "(needs sgl-deep-gemm >= 0.2.3)"}


def probe_deep_gemm() -> DeepGemmProbe:
    """Import deep_gemm and list its public names; an import failure is reported, never raised."""
    version = deep_gemm_version()
    try:
        import deep_gemm  # noqa: PLC0415 - optional, heavy, may be absent
    except Exception as exc:  # absent, or refuses to import (a legacy DG_* variable is set, an ABI mismatch)
        return DeepGemmProbe(version, frozenset(), f"{type(exc).__name__}: {exc}")
    return DeepGemmProbe(version, frozenset(n for n in dir(deep_gemm) if not n.startswith("_")))


def kernel_support(sms: Iterable[int], api: Iterable[str], error: str = "") -> dict[str, dict[str, Any]]:
    """{'fp8_sm90': {possible, why}, 'fp4_sm100': {possible, why}} for a node whose GPUs have these SMs."""
    sms = sorted(set(sms))
    api = frozenset(api)
    out = {}
    for key, ok_sm, need, what in (
        ("fp8_sm90", lambda s: s == 90, SM90_KERNEL_API, "block-FP8 MegaMoE runs on SM90"),
        ("fp4_sm100", lambda s: s // 10 == 10, SM100_KERNEL_API, "FP4 MegaMoE kernels are SM100-only"),
    ):
        if not sms:
            why = "no CUDA GPU visible"
        elif not all(ok_sm(s) for s in sms):
            why = f"{what}; this node has SM {sms}"
        elif not api:
            why = f"deep_gemm does not import ({error or 'not installed'})"
        elif need - api:
            why = f"deep_gemm lacks {sorted(need - api)}"
        else:
            why = ""
        out[key] = {"possible": not why, "why": why}
    return out


def doctor_part(gpu_list: list[dict[str, Any]], probe: Optional[DeepGemmProbe] = None) -> dict[str, Any]:
    """doctor's `hardware.megamoe` section: what this machine can run, the deep_gemm in reach, and the retired or
    refused environment switches that are set."""
    probe = probe if probe is not None else probe_deep_gemm()
    kernels = kernel_support([g["sm"] for g in gpu_list], probe.api, probe.error)
    return {
        **kernels,
        "deep_gemm": {"version": probe.version, "imports": bool(probe.api), "error": probe.error},
        "retired_env": sorted(n for n in RETIRED_ENV if os.environ.get(n, "") not in ("", "0")),
        # deep_gemm >= 0.2.0 refuses to import with this set; the plugin never sets it.
        "dg_use_fp4_acts_set": "DG_USE_FP4_ACTS" in os.environ,
    }


def doctor_problems(part: dict[str, Any]) -> list[str]:
    problems = [Problem(f"{n} is retired; use {RETIRED_ENV[n]}", fix=f"unset {n}") for n in part["retired_env"]]
    if part["dg_use_fp4_acts_set"]:
        problems.append(Problem("DG_USE_FP4_ACTS is set: deep_gemm >= 0.2.0 refuses to import with it; unset it",
                                fix="unset DG_USE_FP4_ACTS"))
    return problems
