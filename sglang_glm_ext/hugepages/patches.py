"""hugepages' patches of SGLang (seed 322-338): the launch check, the RAM check and the two mmap hooks (hooks.py)."""

from __future__ import annotations

from ..declare import Patch, Tier, patch_for
from .feature import FEATURE

patch = patch_for(FEATURE, tier=Tier.FEATURE, sglang_versions=("0.5.23",))

PATCHES: tuple[Patch, ...] = (
    patch(
        id="hugepages.launch_check",
        target="sglang.srt.server_args.ServerArgs.check_server_args",
        hook_type="after",
        hook="sglang_glm_ext.hugepages.hooks:hook_check_server_args",
        reason="In the launcher, before any scheduler is spawned: an SGLANG_HUGEPAGE_SIZE SGLang does not know, or a "
        "host-pool allocator that ignores it, stops the launch instead of silently using ordinary pages; with an "
        "explicit --hicache-size the node's ranks together must fit free - reserved hugepages. Records the "
        "usable pages at launch on the ServerArgs so each rank can check the node total without counting pages "
        "its siblings already took.",
        seed_lines="322-338",
        remove_when="SGLang checks hugepage capacity for the whole node before spawning ranks.",
        signature=("self",),
        source_sha="84a23bc7327d0246",
    ),
    patch(
        id="hugepages.ram_check",
        target="sglang.srt.mem_cache.pool_host.base.host_memory_budget_bytes",
        hook_type="around",
        hook="sglang_glm_ext.hugepages.hooks:hook_host_memory_budget_bytes",
        reason="SGLang's host-pool check counts only MemAvailable, which excludes reserved hugepages, so a correctly "
        "reserved node is refused. A hugepage-backed pool is checked against the hugepages of its size instead "
        "(per NUMA node where the rank is bound; refusal names need, free and the reserve command); "
        "ordinary-page pools get SGLang's answer unchanged.",
        seed_lines="322-338",
        remove_when="SGLang's host-memory budget counts hugepages for hugepage-backed pools.",
        signature=("requested_bytes", "auto_size"),
        source_sha="1b1c4d570cade551",
    ),
    patch(
        id="hugepages.alloc_check",
        target="sglang.srt.mem_cache.storage.mmap.mmap_allocator.alloc_mmap",
        hook_type="around",
        hook="sglang_glm_ext.hugepages.hooks:hook_alloc_mmap",
        reason="alloc_mmap logs and maps ordinary pages on an unknown SGLANG_HUGEPAGE_SIZE or a missing libc; the "
        "hook makes both errors and checks each buffer's pages against what is usable right before the mmap.",
        seed_lines="322-338",
        remove_when="alloc_mmap refuses unknown sizes and checks hugepage capacity itself.",
        signature=("dims", "dtype"),
        source_sha="d3c5d9c09a214206",
    ),
    patch(
        id="hugepages.no_fallback",
        target="sglang.srt.mem_cache.storage.mmap.mmap_allocator._alloc_hugepage",
        hook_type="around",
        hook="sglang_glm_ext.hugepages.hooks:hook_alloc_hugepage",
        reason="A failed MAP_HUGETLB mmap raises OSError, which alloc_mmap catches to fall back to ordinary pages: a "
        "node sized for a TB hugepage cache then takes it from RAM and can run out mid-serving. The hook raises a "
        "clear error (not an OSError) instead, and checks with MADV_POPULATE_WRITE that every page faulted in "
        "(MAP_POPULATE ignores a page a NUMA node or hugetlb cgroup could not give, which would SIGBUS later).",
        seed_lines="322-338",
        remove_when="SGLang fails loudly when a requested hugepage mapping cannot be made.",
        signature=("n_bytes", "alloc_bytes", "extra_flags"),
        source_sha="9bc64c6cb2b345d7",
    ),
)
