"""megamoe as users see it: switched on by SGLang's own `--moe-a2a-backend megamoe`, not by a plugin flag.

Its env vars: one opt-out for the FP4 weight layout, and the fork's two retired switches (set, either refuses the
launch naming its replacement: `guard.RETIRED_ENV`, checked by the launch hook).

One feature for both halves (the GLM MoE fast path and its refusals, seed 10-19/30; the FP4 MegaMoE weights, seed
1-9/20-29): both act exactly when SGLang's a2a backend is megamoe, and an FP4 patch that did not land must stop a
megamoe launch as loudly as a block patch does, since the FP4 scale checks are what stand between a wrong
checkpoint and wrong tokens.
"""

from __future__ import annotations

from typing import Any

from ..declare import EnvVar, Feature

# Read by fp4_hooks when a ModelOpt NVFP4 layer is built under megamoe.
FP4_KEEP_TRTLLM = EnvVar(
    "SGLANG_GLM_EXT_MEGAMOE_FP4_KEEP_TRTLLM", "1",
    "Under --moe-a2a-backend megamoe, ModelOpt NVFP4 experts keep FlashInfer's TRTLLM layout and MegaMoE reads "
    "the same storage (weight_layout=trtllm); 0 = SGLang 0.5.23's in-place MegaMoE repack, no fallback layout.",
)
# The fork's switches (seed 30, 20-29), gone from SGLang; guard.RETIRED_ENV names each one's replacement.
RETIRED_USE_DEEPGEMM_MEGA_MOE = EnvVar(
    "SGLANG_OPT_USE_DEEPGEMM_MEGA_MOE", "",
    "RETIRED (fork-era switch, gone from SGLang): use `--moe-a2a-backend megamoe`. Set, it refuses the launch.",
)
RETIRED_MEGA_MOE_USE_FP4_ACTS = EnvVar(
    "SGLANG_OPT_DEEPGEMM_MEGA_MOE_USE_FP4_ACTS", "",
    "RETIRED: the expert quantisation picks the MegaMoE MMA type (NVFP4 -> nvfp4xnvfp4; MXFP4 -> fp8xfp4, or "
    "mxf4xmxf4 with `--enable-w4a4-mxfp4-megamoe`). Set, it refuses the launch. The plugin never sets "
    "DG_USE_FP4_ACTS (deep_gemm >= 0.2.0 refuses to import with it).",
)
RETIRED_ENV_VARS = (RETIRED_USE_DEEPGEMM_MEGA_MOE, RETIRED_MEGA_MOE_USE_FP4_ACTS)

# SGLang's own switch: `--moe-runner-backend megamoe` is its alias (arg_groups/mega_moe_hook.py:259-276). The last
# two are not switches: doctor takes them too, to state what the replicated GLM-4.x shared expert costs per GPU.
SGLANG_ARGS = ("moe_a2a_backend", "moe_runner_backend", "model_path", "tp_size")


def megamoe_requested(server_args: Any) -> bool:
    """Whether these server arguments ask for MegaMoE: `--moe-a2a-backend megamoe` or its alias. Reads plain
    attributes, so the raw record SGLang publishes, a resolved one and doctor's namespace all answer alike."""
    return (getattr(server_args, "moe_a2a_backend", None) == "megamoe"
            or getattr(server_args, "moe_runner_backend", None) == "megamoe")


FEATURE = Feature(
    "megamoe",
    "DeepGEMM MegaMoE for GLM MoE layers and FP4 MegaMoE weights (on with SGLang's --moe-a2a-backend megamoe)",
    "1-30",
    env=(FP4_KEEP_TRTLLM, *RETIRED_ENV_VARS),
    active_when=megamoe_requested,
    sglang_args=SGLANG_ARGS,
)
