"""gpu_bringup as users see it: ``SGLANG_GLM_EXT_GPU_BRINGUP=1`` serves SGLang 0.5.23 on a CUDA GPU without a real
``sgl_kernel`` (stand-ins in torch, Triton and SGLang's own run-time-compiled kernels), with the SGLang settings such
a node needs; refused, with one line naming the fix, anywhere else."""

from __future__ import annotations

from typing import Any, Mapping

from ..declare import EnvVar, Feature, refuse_tier
# The switch and SGLang's settings are declared where the gate reads them; re-exported here, the feature's face.
from .gate import GPU_BRINGUP, INDEXER_TORCH, REQUIRED, refusal_reason  # noqa: F401

PERTURB_LOADS = EnvVar(
    "SGLANG_GLM_EXT_GPU_BRINGUP_PERTURB_LOADS", "0",
    "TEST-ONLY negative control of the GPU served run: 1 = every HiCache host->device KV load (L2 and L3 hits) is "
    "written back negated and scaled, so a comparison of outputs must fail. Never set it to serve.",
)


def validate(values: Mapping[str, Any]) -> None:
    """With the tier on: refuse (one line) where it cannot run or SGLang is not set up for it."""
    refuse_tier(GPU_BRINGUP, refusal_reason)


def _active(_server_args: Any) -> bool:
    try:
        return GPU_BRINGUP.get_bool()
    except ValueError:
        return False


FEATURE = Feature(
    "gpu_bringup", "SGLang's real server on a CUDA GPU without a real sgl_kernel (torch/Triton stand-ins; bring-up "
    "and tests only)", "-",
    env=(GPU_BRINGUP, PERTURB_LOADS), validate=validate, active_when=_active, needs_cuda_gpu=True,
    sglang_args=("device",),  # doctor takes --device as the CPU mode's does (the tier serves a CUDA one)
)
