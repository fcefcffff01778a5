"""``sgl_kernel.quantization`` of the GPU bring-up stand-in: GGUF ops, imported by SGLang's quantization package at
module level on CUDA and never called for the models this tier serves."""

from ._unavailable import unavailable as _unavailable

ggml_dequantize = _unavailable("ggml_dequantize")
ggml_moe_a8 = _unavailable("ggml_moe_a8")
ggml_mul_mat_a8 = _unavailable("ggml_mul_mat_a8")
ggml_mul_mat_vec_a8 = _unavailable("ggml_mul_mat_vec_a8")
