"""gpu_bringup as users see it: ``SGLANG_GLM_EXT_GPU_BRINGUP=1`` serves SGLang 0.5.23 on a CUDA GPU without a real
``sgl_kernel`` (stand-ins in torch, Triton and SGLang's own run-time-compiled kernels), with the SGLang settings such
a node needs; refused, with one line naming the fix, anywhere else."""

from __future__ import annotations

from typing import Any, Mapping

from ..declare import EnvVar, Feature, refuse_tier

GPU_BRINGUP = EnvVar(
    "SGLANG_GLM_EXT_GPU_BRINGUP", "0",
    "1 = serve on a CUDA GPU without a real sgl_kernel (a torch no sgl-kernel build matches): stand-ins for the "
    "sgl_kernel names SGLang 0.5.23 calls (docs_internal/gpu_bringup.md), named in a warning at start. Bring-up and "
    "tests only. Refused where a real sgl_kernel imports or no CUDA GPU is visible.",
)
PERTURB_LOADS = EnvVar(
    "SGLANG_GLM_EXT_GPU_BRINGUP_PERTURB_LOADS", "0",
    "TEST-ONLY negative control of the GPU served run: 1 = every HiCache host->device KV load (L2 and L3 hits) is "
    "written back negated and scaled, so a comparison of outputs must fail. Never set it to serve.",
)

# SGLang's own settings a node without sgl-kernel needs (docs_internal/gpu_bringup.md says why), as (name, value,
# why): the launch is refused without the first two; the third is needed by GLM-5's DSA indexer without deep_gemm.
RADIX_CORE = ("SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND", "python",
              "the bundled Rust radix-tree core is built against the torch sgl-kernel pins and misreads tensors under "
              "another (ValueError: insert value must be an int64 tensor, at the first radix insert)")
SKIP_KERNEL_CHECK = ("SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK", "1",
                     "launch_server asserts an installed sglang-kernel distribution >= 0.4.9")
INDEXER_TORCH = ("SGLANG_FP8_PAGED_MQA_LOGITS_TORCH", "1",
                 "GLM-5's DSA indexer imports deep_gemm while the model is built unless its torch path is chosen")
REQUIRED = (RADIX_CORE, SKIP_KERNEL_CHECK)


def validate(values: Mapping[str, Any]) -> None:
    """With the tier on: refuse (one line) where it cannot run or SGLang is not set up for it."""
    from .gate import refusal_reason

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
