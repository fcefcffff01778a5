"""``sgl_kernel.speculative`` names SGLang imports on the CPU path (tree speculative decoding); none is served here."""

from ._unavailable import unavailable as _unavailable

IMPLEMENTED = ()
UNAVAILABLE = ("reconstruct_indices_from_tree_mask",)
reconstruct_indices_from_tree_mask = _unavailable("speculative.reconstruct_indices_from_tree_mask")
__all__ = list(UNAVAILABLE)
