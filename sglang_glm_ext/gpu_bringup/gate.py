"""Whether the GPU bring-up tier may run in this process, and making its ``sgl_kernel`` stand-in reachable.

The same mechanism as the CPU serving mode (``cpu_serve/gate.py`` says why ``sys.path``: SGLang's spawned
schedulers import ``sgl_kernel`` before their first line runs, and spawn copies the parent's ``sys.path``):
:func:`activate`, called by ``register()`` in the launching process, puts ``gpu_bringup/_shadow`` (which holds only
the stand-in package) at the front of ``sys.path`` when the tier is on and :func:`refusal_reason` is empty. With the
tier off nothing can import the stand-in.
"""

from __future__ import annotations

import os

from .. import declare

GPU_BRINGUP = declare.EnvVar(
    "SGLANG_GLM_EXT_GPU_BRINGUP", "0",
    "1 = serve on a CUDA GPU without a real sgl_kernel (a torch no sgl-kernel build matches): stand-ins for the "
    "sgl_kernel names SGLang 0.5.23 calls (docs_internal/gpu_bringup.md), named in a warning at start. Bring-up and "
    "tests only. Refused where a real sgl_kernel imports or no CUDA GPU is visible.",
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

CPU_SERVE_SWITCH = "SGLANG_GLM_EXT_CPU_SERVE"  # cpu_serve's switch (a name, not an import: features stay apart)
SHADOW_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_shadow")


def mode_on() -> bool:
    """``SGLANG_GLM_EXT_GPU_BRINGUP`` is set to a true value (a bad value counts as off; validate says so)."""
    return declare.switch_on(GPU_BRINGUP)


def cuda_gpu() -> str:
    """'' when torch sees a CUDA GPU, else why not."""
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - no torch: SGLang cannot run either
        return f"torch does not import ({exc})"
    try:
        if torch.cuda.is_available() and torch.version.cuda:
            return ""
    except Exception as exc:  # noqa: BLE001 - a driver that cannot answer is no GPU we can use
        return f"torch cannot query CUDA ({exc})"
    return "no CUDA GPU is visible to torch"


def missing_settings() -> list[str]:
    """The SGLang settings this tier needs that the environment lacks, each as 'NAME=value (why)'."""
    return [f"{name}={value} ({why})" for name, value, why in REQUIRED if os.environ.get(name) != value]


def refusal_reason() -> str:
    """'' when the tier may run in this process, else one line saying why not and what to do."""
    if os.environ.get(CPU_SERVE_SWITCH, "0").strip().lower() in ("1", "true", "yes", "on"):
        return f"{CPU_SERVE_SWITCH} is set too: the CPU serving mode and the GPU bring-up tier exclude each other"
    gpu = cuda_gpu()
    if gpu:
        return f"{gpu}; on a machine without a CUDA GPU use the CPU serving mode ({CPU_SERVE_SWITCH}=1)"
    real = declare.real_sgl_kernel()
    if real:
        return (f"a real sgl_kernel is installed ({real}); its kernels must serve here, the stand-ins never shadow "
                f"them (unset {GPU_BRINGUP.name})")
    missing = missing_settings()
    if missing:
        return "SGLang needs, without sgl-kernel: " + "; ".join(missing)
    return ""


def standin_reachable() -> bool:
    """Whether ``import sgl_kernel`` in this process (or a child spawned from it) reaches the stand-in."""
    return declare.standin_reachable(SHADOW_DIR)


def activate() -> str:
    """Put the stand-in's directory at the front of ``sys.path`` when the tier is on and may run here. Returns ''
    when the stand-in is reachable now, else why not (the tier is off, or :func:`refusal_reason`)."""
    return declare.activate_standin(SHADOW_DIR, GPU_BRINGUP, refusal_reason)


def warning_line() -> str:
    """The one line ``register()`` logs at WARNING where the tier is active: every stand-in in use, by name."""
    from .kernels import STANDIN_NAMES

    return (f"sglang-glm-ext GPU bring-up ({GPU_BRINGUP.name}=1): sgl_kernel in this process is the plugin's "
            "stand-in, not SGLang's kernels (bring-up and tests only; docs_internal/gpu_bringup.md): "
            + ", ".join(STANDIN_NAMES))
