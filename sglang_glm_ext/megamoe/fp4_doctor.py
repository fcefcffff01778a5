"""doctor's part of FP4 MegaMoE: which deep_gemm is installed and whether it can read the TRTLLM weight layout.

Read from the installed files, without importing deep_gemm: its import loads a compiled torch extension (and
refuses legacy DG_* variables), which a diagnostic must neither pay for nor trip over.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from typing import Any, Optional

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
    >= 0.2.3; absent in 0.2.0)? Without it NVFP4 MegaMoE cannot share FlashInfer's TRTLLM tensors."""
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
