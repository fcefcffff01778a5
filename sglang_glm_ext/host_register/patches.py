"""host_register's patch of SGLang (seed 297-321): a BEFORE hook on _cuda_host_register (hooks.py)."""

from __future__ import annotations

from ..declare import Patch, Tier, patch_for
from .feature import FEATURE

patch = patch_for(FEATURE, tier=Tier.FEATURE, sglang_versions=("0.5.23",))

PATCHES: tuple[Patch, ...] = (
    patch(
        id="host_register.ceiling",
        target="sglang.srt.mem_cache.pool_host.common._cuda_host_register",
        hook_type="before",
        hook="sglang_glm_ext.host_register.hooks:check_cuda_host_register",
        reason="SGLang 0.5.23 registers a layer-first host pool (no copy granularity) in one cudaHostRegister call; "
        "above ~1 TB that fails on B300, and it cannot be split safely without knowing the layer stride. Refuse "
        "at startup with the size, the ceiling and the fix (page_first layout or a smaller --hicache-size); also "
        "refuse an SGLANG_HICACHE_HOST_REGISTER_CHUNK_GB above the ceiling. Never changes what SGLang registers.",
        seed_lines="297-321",
        remove_when="SGLang chunks layer-first host pools at layer boundaries (or caps every registration itself).",
        signature=("buffer", "registration_granularity_bytes"),
        source_sha="f13fb8ab7ebf962a",
    ),
)
