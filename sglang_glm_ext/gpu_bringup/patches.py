"""gpu_bringup's patches of SGLang (Tier.GPU_BRINGUP): register() applies them only where
SGLANG_GLM_EXT_GPU_BRINGUP=1 and ``gate.activate()`` passed in that process (a CUDA GPU, no real sgl_kernel,
SGLang's settings for a node without one); elsewhere each is skipped with the reason, and none is in SGLang's code.
The ``sgl_kernel`` stand-ins are a package on ``sys.path``, not patches."""

from __future__ import annotations

from ..declare import Patch, Tier, patch_for
from .feature import FEATURE

patch = patch_for(FEATURE, tier=Tier.GPU_BRINGUP, sglang_versions=("0.5.23",), seed_lines="-")

PATCHES: tuple[Patch, ...] = (
    patch(
        id="gpu_bringup.dummy_weights",
        target="sglang.srt.model_loader.weight_utils.initialize_dummy_weights",
        hook_type="after",
        hook="sglang_glm_ext.gpu_bringup.hooks:hook_dummy_weights",
        reason="The GPU served run compares outputs, which SGLang's dummy weights (one seed, uniform +-1e-3) make "
        "independent of the prompt. For a model directory written by `sglang-glm-ext tiny-model` (its marker file) "
        "only, the CPU serving mode's seeded, fan-in-scaled init, so both tiers serve the same model.",
        remove_when="never while the GPU served run uses tiny dummy-weight models.",
        signature=("model", "low", "high", "seed"), source_sha="d54d8b145f6ff264",
    ),
    *(patch(
        id=f"gpu_bringup.perturb_{kind}_loads",
        target=f"sglang.srt.mem_cache.pool_host.{kind}.{cls}.load_to_device_per_layer",
        hook_type="around",
        hook="sglang_glm_ext.gpu_bringup.hooks:hook_perturb_loads",
        reason="Negative control of the GPU served run (test-only, off unless "
        "SGLANG_GLM_EXT_GPU_BRINGUP_PERTURB_LOADS=1): the device rows a HiCache load just wrote are negated and "
        "scaled on the load's stream, so comparing outputs with the reference must fail.",
        remove_when="never while the GPU served run's negative control exists.",
        signature=("self", "device_pool", "host_indices", "device_indices", "layer_id", "io_backend", "is_draft"),
        source_sha=sha,
    ) for kind, cls, sha in (("mla", "MLATokenToKVPoolHost", "c9c9131836c6c367"),
                             ("mha", "MHATokenToKVPoolHost", "1206daa053dca863"))),
)
