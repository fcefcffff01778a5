"""A named placeholder for an ``sgl_kernel`` op SGLang imports on the GPU path but never calls for what the GPU
bring-up tier serves (bf16 / fp8 GLM models: no GGUF, no int8 GEMM)."""

from __future__ import annotations


class StandinOpNotImplemented(NotImplementedError):
    """An op of the GPU bring-up ``sgl_kernel`` stand-in that has no implementation was called."""


def unavailable(name: str):
    def op(*args, **kwargs):
        raise StandinOpNotImplemented(
            f"sgl_kernel.{name} was called, but the sglang-glm-ext GPU bring-up stand-in "
            "(SGLANG_GLM_EXT_GPU_BRINGUP=1) has no implementation of it: SGLang imports it on the CUDA path and "
            "calls it only for models this tier does not serve (GGUF, int8 weights, MHA page_head host layouts)")

    op.__name__ = op.__qualname__ = name
    op._glm_ext_unavailable = True
    return op
