"""cpu_serve's patches of SGLang: the launch check (Tier.FEATURE) and the CPU serving stand-ins (Tier.CPU_SERVE).

register() applies the CPU_SERVE tier only when SGLANG_GLM_EXT_CPU_SERVE=1 and ``gate.activate()`` passed in that
process (no accelerator, no real sgl_kernel, SGLANG_USE_CPU_ENGINE=1); elsewhere each is skipped with the reason,
and none is in SGLang's code. The demo's own stand-ins (Tier.DEMO, l3/patches.py) stay demo-only.
"""

from __future__ import annotations

from ..declare import Patch, Tier, patch_for
from .feature import FEATURE
from .kernels import KVCACHEIO_NAMES, MLA_KVCACHEIO_NAMES

_REMOVE_CPU = "SGLang ships a CPU build of sgl-kernel and CPU paths for HiCache copies, DSA and MLA dispatch."

_POOL_INIT = {
    "mla": ("MLATokenToKVPoolHost", ("self", "buffer_info", "host_to_device_ratio", "host_size", "page_size",
                                     "layout", "pin_memory", "device", "allocator_type", "override_kv_cache_dim",
                                     "draft_buffer_infos", "dcp_size", "dcp_rank", "device_capacity_tokens",
                                     "start_layer", "end_layer", "target_layer_num", "layer_shard_enabled",
                                     "pool_label", "host_token_capacity"), "fbfc5db6dcb323d3"),
    "dsa": ("DSAIndexerPoolHost", ("self", "decl", "anchor_host", "packed_draft_device_pools", "pin_memory",
                                   "device", "allocator_type", "is_dummy"), "fd17026872d4edbb"),
    "mha": ("MHATokenToKVPoolHost", ("self", "buffer_info", "host_to_device_ratio", "host_size", "page_size",
                                     "layout", "pin_memory", "device", "allocator_type", "device_capacity_tokens",
                                     "start_layer", "end_layer", "draft_buffer_infos", "write_back_staging",
                                     "pool_label", "head_group_num", "host_token_capacity"), "95be47cf1857ceeb"),
}
# The kvcacheio names each host-pool module calls (tests/cpu_serve/test_standin.py derives them from its source);
# page_head / page_unified (MHA-only layouts L3 does not serve) and the Ascend exchange are left unbound.
_POOL_OPS = {"mla": MLA_KVCACHEIO_NAMES, "dsa": MLA_KVCACHEIO_NAMES,
             "mha": tuple(n for n in KVCACHEIO_NAMES if n != "transfer_kv_all_layer_mla")}

patch = patch_for(FEATURE, tier=Tier.CPU_SERVE, sglang_versions=("0.5.23",), seed_lines="-")

PATCHES: tuple[Patch, ...] = (
    patch(
        id="cpu_serve.launch_check_cli",
        target="sglang.srt.server_args.ServerArgs.from_cli_args",
        hook_type="after",
        hook="sglang_glm_ext.cpu_serve.hooks:hook_from_cli_args",
        tier=Tier.FEATURE,
        reason="With SGLANG_GLM_EXT_CPU_SERVE=1, a launch without --device cpu exits with one line before anything "
        "starts (the accelerator / real sgl_kernel / SGLANG_USE_CPU_ENGINE checks run in the feature's validate, "
        "from the plugin's flag hook; an exception in register() would only be logged by SGLang).",
        remove_when="never: it guards the plugin's own CPU mode.",
        signature=("cls", "args"), source_sha="32152825e268b6da",
    ),
    patch(
        id="cpu_serve.launch_check",
        target="sglang.srt.server_args.ServerArgs.resolve_once",
        hook_type="before",
        hook="sglang_glm_ext.cpu_serve.hooks:hook_resolve_once",
        tier=Tier.FEATURE,
        reason="The same --device cpu check for Engine(...) and every other way a record reaches resolve_once.",
        remove_when="never: it guards the plugin's own CPU mode.",
        signature=("self",), source_sha="a77b5bf3f0348924",
    ),
    patch(
        id="cpu_serve.sgl_kernel_cache_move",
        target="sglang.kernels.ops.kvcache.cache_move",
        hook_type="bind",
        hook="sglang_glm_ext.cpu_serve.hooks:bind_sgl_kernel_names",
        reason="Under SGLANG_USE_CPU_ENGINE=1 cache_move imports copy_all_layer_kv_cache_cpu from sgl_kernel at "
        "import time (scheduler -> checksum -> memory_pool -> cache_move), before load_plugins() runs in the "
        "spawned scheduler; no CPU sgl-kernel build exists. The launching process's register() puts "
        "cpu_serve/_shadow (the sgl_kernel stand-in) at the front of sys.path, which spawn copies into every "
        "child; this binding checks the name came from the stand-in (a torch row move, kernels.py).",
        remove_when=_REMOVE_CPU,
        signature=("copy_all_layer_kv_cache_cpu",),
    ),
    patch(
        id="cpu_serve.sgl_kernel_allocation",
        target="sglang.srt.mem_cache.allocation",
        hook_type="bind",
        hook="sglang_glm_ext.cpu_serve.hooks:bind_sgl_kernel_names",
        reason="allocation.py imports assign_req_to_token_pool_cpu from sgl_kernel under the CPU engine; the "
        "stand-in's torch implementation (kernels.py) is what it binds.",
        remove_when=_REMOVE_CPU,
        signature=("assign_req_to_token_pool_cpu",),
    ),
    *(patch(
        id=f"cpu_serve.kvcacheio_{kind}",
        target=f"sglang.srt.mem_cache.pool_host.{kind}",
        hook_type="bind",
        hook="sglang_glm_ext.cpu_serve.hooks:bind_kvcacheio",
        reason=f"pool_host/{kind}.py binds the sgl_kernel.kvcacheio copies only under _is_cuda/_is_hip/_is_xpu, "
        "so on a CPU every HiCache D2H/H2D raises NameError. Bind torch copies (kernels.py) for each unbound name "
        "it calls, for the layouts and io backends L3 serves (layer_first, page_first, page_first_direct; "
        "direct and kernel I/O).",
        remove_when=_REMOVE_CPU,
        signature=_POOL_OPS[kind],
    ) for kind in ("mha", "mla", "dsa")),
    *(patch(
        id=f"cpu_serve.unpinned_{kind}_host_pool",
        target=f"sglang.srt.mem_cache.pool_host.{kind}.{cls}.__init__",
        hook_type="around",
        hook="sglang_glm_ext.cpu_serve.hooks:hook_unpinned_host_pool",
        reason="pin_memory=True calls cudaHostRegister (torch.cuda.cudart(): 'Found no NVIDIA driver') and "
        "torch.zeros(pin_memory=True) in the generic storage read; without a driver the host pool is pageable.",
        remove_when="SGLang skips pinning when no accelerator is present.",
        signature=sig, source_sha=sha,
    ) for kind, (cls, sig, sha) in _POOL_INIT.items()),
    patch(
        id="cpu_serve.no_cuda_capability",
        target="sglang.srt.arg_groups.model_hook.handle_model_specific_adjustments",
        hook_type="around",
        hook="sglang_glm_ext.cpu_serve.hooks:hook_model_adjustments",
        reason="DSA argument resolution calls torch.cuda.get_device_capability() unguarded (model_hook.py ~341, "
        "overrides.py ~512/~581/~631: 'not NPU and not XPU' is taken as CUDA/ROCm); without a CUDA device it "
        "answers (0, 0) during this call (the KV cache resolves to bf16).",
        remove_when="SGLang's DSA resolution has a CPU branch.",
        signature=("server_args",), source_sha="1c321ef6fec85a67",
    ),
    patch(
        id="cpu_serve.torch_native_mla_dispatch",
        target="sglang.srt.models.deepseek_common.attention_backend_handler.AttentionBackendRegistry.get_handler",
        hook_type="around",
        hook="sglang_glm_ext.cpu_serve.hooks:hook_get_handler",
        reason="torch_native has no MLA handler; the default (triton's) picks MHA for a prefix-free prefill, "
        "which reads the MLA pool as MHA. Route torch_native to SGLang's own _dispatch_mla_subtype.",
        remove_when="SGLang registers a torch_native MLA handler.",
        signature=("cls", "backend_name"), source_sha="b2cf2a026397b847",
    ),
    patch(
        id="cpu_serve.dsa_indexer_k_cache",
        target="sglang.srt.layers.attention.dsa.dsa_indexer.Indexer.forward_native",
        hook_type="replace",
        hook="sglang_glm_ext.cpu_serve.hooks:indexer_forward_native",
        reason="0.5.23's DSA indexer has no native path ('Indexer has no native (pure-torch) path'). The K-cache "
        "half in torch (wk -> k_norm -> rope -> Hadamard -> per-block fp8 -> index-K cache page, through SGLang's "
        "own _store_index_k_cache), returning None as the CUDA path does when the backend gives no indexer "
        "metadata: attention runs dense (equal to sparse only up to index_topk tokens).",
        remove_when="SGLang ships a native DSA indexer.",
        signature=("self", "args", "kwargs"), source_sha="4b24b15729712af3",
    ),
    patch(
        id="cpu_serve.index_k_writer",
        target="sglang.kernels.ops.kvcache.dsa_index_k_cache.SetKAndS.execute",
        hook_type="around",
        hook="sglang_glm_ext.cpu_serve.hooks:hook_set_k_and_s",
        reason="The index-K page writer is a Triton kernel; a CPU buffer is written by the torch set_k_and_s "
        "(same page layout: page_size x 128 fp8 key bytes, then page_size x fp32 scales).",
        remove_when="SGLang ships a native DSA indexer.",
        signature=("cls", "args", "buf", "kwargs"), source_sha="5355ac0b95c02f95",
    ),
    *(patch(
        id=f"cpu_serve.perturb_{kind}_loads",
        target=f"sglang.srt.mem_cache.pool_host.{kind}.{cls}.load_to_device_per_layer",
        hook_type="around",
        hook="sglang_glm_ext.cpu_serve.hooks:hook_perturb_loads",
        reason="Negative control of the main job (test-only, off unless SGLANG_GLM_EXT_CPU_SERVE_PERTURB_LOADS=1): "
        "the device rows a HiCache load just wrote are negated and scaled, so comparing outputs with the "
        "reference must fail; proves the comparison can see wrong reloaded KV.",
        remove_when="never while the main job's negative control exists.",
        signature=("self", "device_pool", "host_indices", "device_indices", "layer_id", "io_backend", "is_draft"),
        source_sha=sha,
    ) for kind, cls, sha in (("mla", "MLATokenToKVPoolHost", "c9c9131836c6c367"),
                             ("mha", "MHATokenToKVPoolHost", "1206daa053dca863"))),
    patch(
        id="cpu_serve.dummy_weights",
        target="sglang.srt.model_loader.weight_utils.initialize_dummy_weights",
        hook_type="after",
        hook="sglang_glm_ext.cpu_serve.hooks:hook_dummy_weights",
        reason="SGLang's dummy weights (uniform +-1e-3 with one seed for every parameter) make a tiny model's greedy "
        "output independent of the prompt, so any comparison of outputs would pass vacuously. For a model "
        "directory written by `sglang-glm-ext tiny-model` (its marker file) only, each parameter gets seeded, "
        "fan-in-scaled values, the same on every launch.",
        remove_when="never while the CPU tiny models use dummy weights.",
        signature=("model", "low", "high", "seed"), source_sha="d54d8b145f6ff264",
    ),
    patch(
        id="cpu_serve.cpu_stream_synchronize",
        target="sglang.srt.mem_cache.l2_transfer.L2TransferEngine.__init__",
        hook_type="after",
        hook="sglang_glm_ext.cpu_serve.hooks:hook_cpu_streams",
        reason="torch.cpu.Stream has no synchronize(); the L2 transfer error path calls it (l2_transfer.py ~123), "
        "so an AttributeError would replace the real error. The engine's CPU streams get a no-op synchronize "
        "(CPU work is synchronous).",
        remove_when="torch.cpu.Stream has synchronize().",
        signature=("self", "io_backend"), source_sha="c702d5a13550d5f7",
    ),
)
