"""The SGLang side of the GPU bring-up tier (patches declared in ``gpu_bringup/patches.py``, ``Tier.GPU_BRINGUP``:
applied by ``register()`` only when the tier is on and ``gate.activate()`` passed; each also asks :func:`_on` at call
time and otherwise runs SGLang's own code).

The stand-ins themselves need no patch (``sgl_kernel`` is a package on ``sys.path``); these two serve the served
run's proof on the GPU exactly as the CPU serving mode's do on a CPU, with the same pure pieces: a tiny model's
seeded dummy weights (without them a random model's greedy output does not depend on the prompt, and every
comparison passes vacuously) and the negative control's perturbed loads.
"""

from __future__ import annotations

import logging

from ..cpu_serve import kernels as serve_kernels, tiny_model
from . import gate
from .feature import PERTURB_LOADS

logger = logging.getLogger("sglang_glm_ext")

__all__ = ["hook_dummy_weights", "hook_perturb_loads"]


def _on() -> bool:
    return gate.mode_on() and gate.standin_reachable()


def hook_dummy_weights(result, model, *args, **kwargs):
    """AFTER weight_utils.initialize_dummy_weights: for a model directory written by `sglang-glm-ext tiny-model`
    (its marker file), seeded, fan-in-scaled values (the CPU serving mode's init, so both tiers serve the same
    model); any other model keeps SGLang's dummy weights."""
    if not _on():
        return result
    from ..declare import published_server_args

    seed = tiny_model.scaled_dummy_seed(getattr(published_server_args(), "model_path", None))
    if seed is not None:
        n = serve_kernels.scaled_dummy_init(model.state_dict().items(), seed)
        logger.info("sglang-glm-ext gpu_bringup: scaled dummy weights for the tiny model (%d parameters, seed %d)",
                    n, seed)
    return result


def hook_perturb_loads(original, self, device_pool, host_indices, device_indices, layer_id, io_backend, *args,
                       **kwargs):
    """AROUND a host pool's load_to_device_per_layer: with SGLANG_GLM_EXT_GPU_BRINGUP_PERTURB_LOADS=1 (test-only),
    the device rows just loaded are negated and scaled (on the load's stream, after it), so the served run's
    comparison must catch wrong reloaded KV."""
    result = original(self, device_pool, host_indices, device_indices, layer_id, io_backend, *args, **kwargs)
    if _on() and PERTURB_LOADS.get_bool() and device_indices is not None and device_indices.numel():
        serve_kernels.perturb_loaded_rows(self, layer_id, device_indices)
    return result
