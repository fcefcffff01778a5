"""``sgl_kernel`` stand-in of sglang-glm-ext's GPU bring-up tier (``SGLANG_GLM_EXT_GPU_BRINGUP=1``), NOT SGLang's
kernels: for a CUDA GPU whose torch no sgl-kernel build matches (the lent H200 / H100 image's torch 2.11).

SGLang 0.5.23 imports these names at module level on the CUDA path (``tests/gpu_bringup/test_standin.py`` checks the
list against the installed SGLang's source). What the served path calls is implemented: in torch
(``gpu_bringup/kernels.py``, each checked against a reference), or handed to SGLang's own run-time-compiled kernel
where one takes the same arguments (``moe_align_block_size``; the HiCache copies in ``kvcacheio``). The rest raise
``StandinOpNotImplemented`` naming the op. A name that is not here is an ImportError / AttributeError as without
sgl_kernel, so SGLang's own fallbacks still run; each such name asked for is logged once. No ``torch.ops.sgl_kernel``
op is registered (SGLang probes for some to switch CPU paths on).
"""

from __future__ import annotations

import logging

from sglang_glm_ext.gpu_bringup import kernels as _k

from . import kvcacheio, quantization, utils  # noqa: F401 - submodules SGLang imports by name
from ._unavailable import StandinOpNotImplemented, unavailable as _unavailable

GLM_EXT_STANDIN = True  # one of the plugin's stand-ins (declare.real_sgl_kernel never takes it for a real one)
GLM_EXT_GPU_STANDIN = True
__version__ = "0.0.0+sglang-glm-ext.gpu-standin"
_log = logging.getLogger("sglang_glm_ext")

# Called on the served path: torch implementations (norms in fp32, as the real kernels compute them).
rmsnorm = _k.rmsnorm
fused_add_rmsnorm = _k.fused_add_rmsnorm
gemma_rmsnorm = _k.gemma_rmsnorm
gemma_fused_add_rmsnorm = _k.gemma_fused_add_rmsnorm
silu_and_mul = _k.silu_and_mul
gelu_and_mul = _k.gelu_and_mul
gelu_tanh_and_mul = _k.gelu_tanh_and_mul
moe_sum_reduce = _k.moe_sum_reduce
top_k_renorm_prob = _k.top_k_renorm_prob
top_p_renorm_prob = _k.top_p_renorm_prob
weak_ref_tensor = _k.weak_ref_tensor


def moe_align_block_size(topk_ids, num_experts, block_size, sorted_token_ids, experts_ids, num_tokens_post_pad,
                         cumsum_buffer, pad_sorted_token_ids=False, ignore_invalid_expert=False):
    """SGLang's JIT ``kernels/ops/moe/moe_align.py`` (the same first eight arguments and bucket convention; SGLang
    asks for the AOT op by name although this one exists); the torch version where that cannot run."""
    if not ignore_invalid_expert:
        try:
            from sglang.kernels.ops.moe.moe_align import moe_align_block_size as jit_align

            return jit_align(topk_ids, num_experts, block_size, sorted_token_ids, experts_ids, num_tokens_post_pad,
                             cumsum_buffer, pad_sorted_token_ids)
        except Exception as exc:  # noqa: BLE001 - a JIT build that fails degrades to the torch op, said once
            kvcacheio.note_fallback("moe_align_block_size", exc)
    return _k.moe_align_block_size(topk_ids, num_experts, block_size, sorted_token_ids, experts_ids,
                                   num_tokens_post_pad, cumsum_buffer, pad_sorted_token_ids, ignore_invalid_expert)


# Imported at module level on the CUDA path, never called for what this tier serves: each raises by name.
int8_scaled_mm = _unavailable("int8_scaled_mm")
moe_sum = _unavailable("moe_sum")
cutlass_w4a8_moe_mm = _unavailable("cutlass_w4a8_moe_mm")
get_cutlass_w4a8_moe_mm_data = _unavailable("get_cutlass_w4a8_moe_mm_data")
es_fp8_blockwise_scaled_grouped_mm = _unavailable("es_fp8_blockwise_scaled_grouped_mm")
es_sm100_mxfp8_blockscaled_grouped_mm = _unavailable("es_sm100_mxfp8_blockscaled_grouped_mm")
es_sm100_mxfp8_blockscaled_grouped_quant = _unavailable("es_sm100_mxfp8_blockscaled_grouped_quant")
fp8_blockwise_scaled_grouped_mm = _unavailable("fp8_blockwise_scaled_grouped_mm")
merge_state_v2 = _unavailable("merge_state_v2")
shuffle_rows = _unavailable("shuffle_rows")

IMPLEMENTED, UNAVAILABLE = _k.STANDIN_NAMES, _k.UNAVAILABLE_NAMES
_asked: set = set()


def __getattr__(name: str):
    """A name the stand-in lacks: what an absent sgl_kernel gives (AttributeError; ``from sgl_kernel import x`` an
    ImportError), logged once so a bring-up shows every name SGLang asked for."""
    if not name.startswith("__") and name not in _asked:
        _asked.add(name)
        _log.warning("sglang-glm-ext GPU bring-up: SGLang asked the sgl_kernel stand-in for %r, which it lacks", name)
    raise AttributeError(f"module 'sgl_kernel' (the sglang-glm-ext GPU bring-up stand-in) has no attribute {name!r}")


__all__ = [n for n in (*IMPLEMENTED, *UNAVAILABLE) if "." not in n] + ["StandinOpNotImplemented"]
