"""``sgl_kernel`` stand-in of sglang-glm-ext's CPU serving mode (``SGLANG_GLM_EXT_CPU_SERVE=1``), NOT SGLang's kernels.

SGLang 0.5.23 imports these names from ``sgl_kernel`` at module import time when ``SGLANG_USE_CPU_ENGINE=1``
(the list is checked against the installed SGLang's source by ``tests/cpu_serve/test_standin_contract.py``); no
CPU build of sgl-kernel exists on the registry. The two that the served path calls have faithful torch
implementations (``sglang_glm_ext/cpu_serve/kernels.py``, each tested against a reference); every other name raises
``StandinOpNotImplemented`` naming the op when called. There is no catch-all: a name not listed here is an
ImportError, exactly as SGLang's try/except fallbacks expect. No ``torch.ops.sgl_kernel`` op is registered, so
SGLang's Intel AMX detection (``_is_intel_amx_backend_available``) stays false and its native paths run.

Reachable only through the directory ``cpu_serve/_shadow`` that the plugin puts on ``sys.path`` when the mode is on
and no accelerator and no real ``sgl_kernel`` are present.
"""

from sglang_glm_ext.cpu_serve import kernels as _kernels

from ._unavailable import StandinOpNotImplemented, unavailable as _unavailable

GLM_EXT_CPU_STANDIN = True
GLM_EXT_STANDIN = True  # one of the plugin's stand-ins (declare.real_sgl_kernel never takes it for a real one)
__version__ = "0.0.0+sglang-glm-ext.cpu-standin"

# Implemented (called on the CPU serving path).
IMPLEMENTED = ("copy_all_layer_kv_cache_cpu", "assign_req_to_token_pool_cpu")
copy_all_layer_kv_cache_cpu = _kernels.copy_all_layer_kv_cache_cpu
assign_req_to_token_pool_cpu = _kernels.assign_req_to_token_pool_cpu

# Imported on the CPU path, never called by what this mode serves: each raises, naming itself.
UNAVAILABLE = (
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "build_tree_kernel_efficient_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "rotate_input_ids_cpu",
    "verify_tree_greedy_cpu",
    "gelu_and_mul",
    "silu_and_mul",
)
assign_draft_cache_locs_contiguous_cpu = _unavailable("assign_draft_cache_locs_contiguous_cpu")
assign_extend_cache_locs_cpu = _unavailable("assign_extend_cache_locs_cpu")
build_tree_kernel_efficient_cpu = _unavailable("build_tree_kernel_efficient_cpu")
fill_accept_out_cache_loc_cpu = _unavailable("fill_accept_out_cache_loc_cpu")
fill_bonus_tokens_cpu = _unavailable("fill_bonus_tokens_cpu")
rotate_input_ids_cpu = _unavailable("rotate_input_ids_cpu")
verify_tree_greedy_cpu = _unavailable("verify_tree_greedy_cpu")
gelu_and_mul = _unavailable("gelu_and_mul")
silu_and_mul = _unavailable("silu_and_mul")

# Sub-modules with names on the CPU path: sgl_kernel.mamba, sgl_kernel.speculative.
SUBMODULES = ("mamba", "speculative")

__all__ = [*IMPLEMENTED, *UNAVAILABLE, "StandinOpNotImplemented"]
