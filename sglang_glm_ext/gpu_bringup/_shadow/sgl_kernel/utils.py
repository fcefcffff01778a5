"""``sgl_kernel.utils`` of the GPU bring-up stand-in: ``is_arch_support_pdl`` is SGLang's own run-time check."""

from __future__ import annotations


def is_arch_support_pdl() -> bool:
    """Programmatic dependent launch on this GPU (SM90+): the answer of SGLang's JIT utilities, which the real op
    gives too (triton_backend reads it for its own Triton kernels' launches)."""
    from sglang.kernels.jit.utils import is_arch_support_pdl as sglang_is_arch_support_pdl

    return bool(sglang_is_arch_support_pdl())
