"""A named placeholder for an ``sgl_kernel`` op SGLang imports on the CPU path but never calls there."""

from __future__ import annotations


class StandinOpNotImplemented(NotImplementedError):
    """An op of the CPU ``sgl_kernel`` stand-in that has no CPU implementation was called."""


def unavailable(name: str):
    def op(*args, **kwargs):
        raise StandinOpNotImplemented(
            f"sgl_kernel.{name} was called, but the sglang-glm-ext CPU serving stand-in (SGLANG_GLM_EXT_CPU_SERVE=1) "
            "has no implementation of it: SGLang imports it on the CPU path and calls it only for features this "
            "mode does not serve (speculative decoding, Mamba/GDN layers, non-CUDA MoE activations)")

    op.__name__ = op.__qualname__ = name
    op._glm_ext_unavailable = True
    return op
