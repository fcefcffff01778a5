"""gpu_bringup: SGLang's real server on a GPU node whose torch no published sgl-kernel build matches (the lent
H200 / H100 image: torch 2.11), through stand-ins for the ``sgl_kernel`` names SGLang 0.5.23 calls there. A bring-up
and test tier, never a production path: switched on only by SGLANG_GLM_EXT_GPU_BRINGUP=1, refused where a real
sgl_kernel imports, and it names every stand-in in one warning at start. No seed lines: the fork had sgl-kernel."""
