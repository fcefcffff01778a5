"""cg_mem's patches of SGLang (seed 152-162): two AROUND hooks on DecodeCudaGraphRunner (cuda_graph_mem/hooks.py)."""

from __future__ import annotations

from ..declare import Patch, Tier, patch_for
from .feature import FEATURE

patch = patch_for(FEATURE, tier=Tier.FEATURE, sglang_versions=("0.5.23",))

PATCHES: tuple[Patch, ...] = (
    patch(
        id="cg_mem.capture",
        target="sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.capture",
        hook_type="around",
        hook="sglang_glm_ext.cuda_graph_mem.hooks:hook_capture",
        reason="Attribute decode CUDA-graph memory at capture (rank 0, when cg_mem is on): static buffer table "
        "with cross-family aliasing, graph-pool growth per shape, family TOTAL. capture() runs in every "
        "decode-graph runner's __init__ after share_buffers() and no EAGLE runner overrides it; their "
        "capture_one_shape overrides are covered by a per-capture instance attribute, not more patches.",
        seed_lines="152-162",
        remove_when="SGLang logs per-runner static buffers and graph-pool growth per captured shape itself.",
        signature=("self",),
        source_sha="4e54deacc7c6003e",
    ),
    patch(
        id="cg_mem.profile_pickle",
        target="sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner"
        "._post_process_after_profile",
        hook_type="around",
        hook="sglang_glm_ext.cuda_graph_mem.hooks:hook_post_process_after_profile",
        reason="--enable-profile-cuda-graph: write cuda_graph_mem_<family>.pickle per runner; SGLang dumps every "
        "runner's snapshot to one fixed cuda_graph_runner_memory_usage.pickle, so each overwrites the last.",
        seed_lines="152-162",
        remove_when="SGLang names the capture memory snapshot per runner.",
        signature=("self", "prof_context"),
        source_sha="2832e47a32038c28",
    ),
)
