"""``sgl_kernel.mamba`` names SGLang imports on the CPU path (GDN / KDA layers); none is served here."""

from ._unavailable import unavailable as _unavailable

IMPLEMENTED = ()
UNAVAILABLE = ("causal_conv1d_fn_cpu", "causal_conv1d_update_cpu", "chunk_gated_delta_rule_cpu")
causal_conv1d_fn_cpu = _unavailable("mamba.causal_conv1d_fn_cpu")
causal_conv1d_update_cpu = _unavailable("mamba.causal_conv1d_update_cpu")
chunk_gated_delta_rule_cpu = _unavailable("mamba.chunk_gated_delta_rule_cpu")
__all__ = list(UNAVAILABLE)
