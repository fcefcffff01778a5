"""Every change sglang-glm-ext makes to SGLang, declared in one place.

docs_internal/patch_manifest.md is generated from this list (`sglang-glm-ext manifest --write`, checked by
tests/patching/test_manifest.py), and tests/test_contracts.py checks every target's signature and source
digest in the installed SGLang, so an SGLang upgrade fails fast and names what moved.
"""

from __future__ import annotations

from .patching.ledger import Patch, Tier

V0523 = ("0.5.23",)

PATCHES: tuple[Patch, ...] = (
    Patch(
        id="flags.cli_group",
        target="sglang.srt.server_args.ServerArgs.add_cli_args",
        hook_type="after",
        hook="sglang_glm_ext.flags:hook_add_cli_args",
        feature="flags",
        tier=Tier.GUARD,
        reason="Register the plugin's flags on SGLang's parser so launch_server/serve/--config accept them and "
        "--help lists them (ServerArgs is a sealed msgspec struct; no field can be added).",
        seed_lines="458-486 (--enable-cp-l3, --cp-l3-config), 152-162 (CG buffer logging switch)",
        sglang_versions=V0523,
        remove_when="SGLang offers a public API for plugin CLI arguments.",
        signature=("parser",),
        source_sha="8d5f9b207365f5ba",
    ),
    Patch(
        id="flags.from_cli",
        target="sglang.srt.server_args.ServerArgs.from_cli_args",
        hook_type="after",
        hook="sglang_glm_ext.flags:hook_from_cli_args",
        feature="flags",
        tier=Tier.GUARD,
        reason="Move the plugin flag values onto the ServerArgs record (bookkeeping attribute `_glm_ext`, "
        "pickled to scheduler subprocesses) and validate them before serving starts.",
        seed_lines="458-486",
        sglang_versions=V0523,
        remove_when="SGLang offers a public API for plugin CLI arguments.",
        signature=("cls", "args"),
        source_sha="32152825e268b6da",
    ),
    Patch(
        id="flags.engine_kwargs",
        target="sglang.srt.entrypoints.engine.Engine.__init__",
        hook_type="around",
        hook="sglang_glm_ext.flags:hook_engine_init",
        feature="flags",
        tier=Tier.GUARD,
        reason="Accept the plugin's options as Engine(...) keywords: take them out before msgspec rejects "
        "them, validate, and attach them to the ServerArgs the Engine builds.",
        seed_lines="458-486",
        sglang_versions=V0523,
        remove_when="SGLang offers a public API for plugin options on Engine.",
        signature=("self", "kwargs"),
        source_sha="54412adbf86ad86b",
    ),
    # --- cg_mem patches (seed 152-162; owner: sglang_glm_ext/cgmem) ---
    Patch(
        id="cg_mem.capture",
        target="sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.capture",
        hook_type="around",
        hook="sglang_glm_ext.cgmem.hooks:hook_capture",
        feature="cg_mem",
        tier=Tier.FEATURE,
        reason="Attribute decode CUDA-graph memory at capture (rank 0, when cg_mem is on): static buffer table "
        "with cross-family aliasing, graph-pool growth per shape, family TOTAL. capture() runs in every "
        "decode-graph runner's __init__ after share_buffers() and no EAGLE runner overrides it; their "
        "capture_one_shape overrides are covered by a per-capture instance attribute, not more patches.",
        seed_lines="152-162",
        sglang_versions=V0523,
        remove_when="SGLang logs per-runner static buffers and graph-pool growth per captured shape itself.",
        signature=("self",),
        source_sha="4e54deacc7c6003e",
    ),
    Patch(
        id="cg_mem.profile_pickle",
        target="sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner"
        "._post_process_after_profile",
        hook_type="around",
        hook="sglang_glm_ext.cgmem.hooks:hook_post_process_after_profile",
        feature="cg_mem",
        tier=Tier.FEATURE,
        reason="--enable-profile-cuda-graph: write cuda_graph_mem_<family>.pickle per runner; SGLang dumps every "
        "runner's snapshot to one fixed cuda_graph_runner_memory_usage.pickle, so each overwrites the last.",
        seed_lines="152-162",
        sglang_versions=V0523,
        remove_when="SGLang names the capture memory snapshot per runner.",
        signature=("self", "prof_context"),
        source_sha="2832e47a32038c28",
    ),
    # --- end cg_mem ---
    # --- host_register / regression-fix patches (seed 297-321 and any fix 0.5.23 lacks) ---
    Patch(
        id="host_register.ceiling",
        target="sglang.srt.mem_cache.pool_host.common._cuda_host_register",
        hook_type="before",
        hook="sglang_glm_ext.hostmem.hook:check_cuda_host_register",
        feature="host_register",
        tier=Tier.FEATURE,
        reason="SGLang 0.5.23 registers a layer-first host pool (no copy granularity) in one cudaHostRegister call; "
        "above ~1 TB that fails on B300, and it cannot be split safely without knowing the layer stride. Refuse "
        "at startup with the size, the ceiling and the fix (page_first layout or a smaller --hicache-size); also "
        "refuse an SGLANG_HICACHE_HOST_REGISTER_CHUNK_GB above the ceiling. Never changes what SGLang registers.",
        seed_lines="297-321",
        sglang_versions=V0523,
        remove_when="SGLang chunks layer-first host pools at layer boundaries (or caps every registration itself).",
        signature=("buffer", "registration_granularity_bytes"),
        source_sha="f13fb8ab7ebf962a",
    ),
    # --- end host_register ---
    # --- hugepages (seed 322-338; owner: sglang_glm_ext/hostmem, hooks in hostmem/hugepages_hooks.py) ---
    Patch(
        id="hugepages.launch_check",
        target="sglang.srt.server_args.ServerArgs.check_server_args",
        hook_type="after",
        hook="sglang_glm_ext.hostmem.hugepages_hooks:hook_check_server_args",
        feature="hugepages",
        tier=Tier.FEATURE,
        reason="In the launcher, before any scheduler is spawned: an SGLANG_HUGEPAGE_SIZE SGLang does not know, or a "
        "host-pool allocator that ignores it, stops the launch instead of silently using ordinary pages; with an "
        "explicit --hicache-size the node's ranks together must fit free - reserved hugepages. Records the "
        "usable pages at launch on the ServerArgs so each rank can check the node total without counting pages "
        "its siblings already took.",
        seed_lines="322-338",
        sglang_versions=V0523,
        remove_when="SGLang checks hugepage capacity for the whole node before spawning ranks.",
        signature=("self",),
        source_sha="84a23bc7327d0246",
    ),
    Patch(
        id="hugepages.ram_check",
        target="sglang.srt.mem_cache.pool_host.base.host_memory_budget_bytes",
        hook_type="around",
        hook="sglang_glm_ext.hostmem.hugepages_hooks:hook_host_memory_budget_bytes",
        feature="hugepages",
        tier=Tier.FEATURE,
        reason="SGLang's host-pool check counts only MemAvailable, which excludes reserved hugepages, so a correctly "
        "reserved node is refused. A hugepage-backed pool is checked against the hugepages of its size instead "
        "(per NUMA node where the rank is bound; refusal names need, free and the reserve command); "
        "ordinary-page pools get SGLang's answer unchanged.",
        seed_lines="322-338",
        sglang_versions=V0523,
        remove_when="SGLang's host-memory budget counts hugepages for hugepage-backed pools.",
        signature=("requested_bytes", "auto_size"),
        source_sha="1b1c4d570cade551",
    ),
    Patch(
        id="hugepages.alloc_check",
        target="sglang.srt.mem_cache.storage.mmap.mmap_allocator.alloc_mmap",
        hook_type="around",
        hook="sglang_glm_ext.hostmem.hugepages_hooks:hook_alloc_mmap",
        feature="hugepages",
        tier=Tier.FEATURE,
        reason="alloc_mmap logs and maps ordinary pages on an unknown SGLANG_HUGEPAGE_SIZE or a missing libc; the "
        "hook makes both errors and checks each buffer's pages against what is usable right before the mmap.",
        seed_lines="322-338",
        sglang_versions=V0523,
        remove_when="alloc_mmap refuses unknown sizes and checks hugepage capacity itself.",
        signature=("dims", "dtype"),
        source_sha="d3c5d9c09a214206",
    ),
    Patch(
        id="hugepages.no_fallback",
        target="sglang.srt.mem_cache.storage.mmap.mmap_allocator._alloc_hugepage",
        hook_type="around",
        hook="sglang_glm_ext.hostmem.hugepages_hooks:hook_alloc_hugepage",
        feature="hugepages",
        tier=Tier.FEATURE,
        reason="A failed MAP_HUGETLB mmap raises OSError, which alloc_mmap catches to fall back to ordinary pages: a "
        "node sized for a TB hugepage cache then takes it from RAM and can run out mid-serving. The hook raises a "
        "clear error (not an OSError) instead, and checks with MADV_POPULATE_WRITE that every page faulted in "
        "(MAP_POPULATE ignores a page a NUMA node or hugetlb cgroup could not give, which would SIGBUS later).",
        seed_lines="322-338",
        sglang_versions=V0523,
        remove_when="SGLang fails loudly when a requested hugepage mapping cannot be made.",
        signature=("n_bytes", "alloc_bytes", "extra_flags"),
        source_sha="9bc64c6cb2b345d7",
    ),
    # --- end hugepages ---
)
