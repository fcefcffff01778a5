"""Every environment variable the plugin reads, in one table (DeepGEMM style).

`docs` and the README table are generated from ENV_VARS, so a variable that is read but not declared here is a
bug (tests/test_envs.py greps the package for os.environ reads of SGLANG_* names and checks they are declared).
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class EnvVar:
    name: str
    default: str
    feature: str
    help: str

    def raw(self) -> str | None:
        return os.environ.get(self.name)

    def get_bool(self) -> bool:
        value = os.environ.get(self.name, self.default).strip().lower()
        if value in ("1", "true", "yes", "on"):
            return True
        if value in ("", "0", "false", "no", "off"):
            return False
        raise ValueError(f"{self.name}={os.environ.get(self.name)!r}: expected 1/0/true/false")

    def is_set(self) -> bool:
        return self.name in os.environ


DISABLE = EnvVar(
    "SGLANG_GLM_EXT_DISABLE", "0", "plugin",
    "Kill switch: 1 = the plugin loads but applies no patch and registers no flag (A/B whether a problem is ours).",
)
FORCE_UNSUPPORTED = EnvVar(
    "SGLANG_GLM_EXT_FORCE_UNSUPPORTED", "0", "plugin",
    "1 = apply feature patches on an SGLang version outside the supported range, at your own risk.",
)
LOG_CG_BUFFERS = EnvVar(
    "SGLANG_LOG_CG_BUFFERS", "0", "cg_mem",
    "1 = at decode CUDA-graph capture, rank 0 logs static buffers, aliasing and graph-pool growth per shape "
    "(same as --log-cuda-graph-buffers).",
)
CP_L3_COLD_START = EnvVar(
    "SGLANG_CP_L3_COLD_START", "", "l3",
    "Overrides the L3 config's cold_start ('clear' or 'load') for this launch.",
)
HOST_REGISTER_MAX_GB = EnvVar(
    "SGLANG_GLM_EXT_HOST_REGISTER_MAX_GB", "480", "host_register",
    "Largest single cudaHostRegister the plugin allows (GiB); B300 fails at 1024 GiB, 512 GiB works.",
)

# --- megamoe fp4 ---
MEGAMOE_FP4_KEEP_TRTLLM = EnvVar(
    "SGLANG_GLM_EXT_MEGAMOE_FP4_KEEP_TRTLLM", "1", "megamoe_fp4",
    "Under --moe-a2a-backend megamoe, ModelOpt NVFP4 experts keep FlashInfer's TRTLLM layout and MegaMoE reads "
    "the same storage (weight_layout=trtllm); 0 = SGLang 0.5.23's in-place MegaMoE repack, no fallback layout.",
)
# --- end megamoe fp4 ---

ENV_VARS: tuple[EnvVar, ...] = (DISABLE, FORCE_UNSUPPORTED, LOG_CG_BUFFERS, CP_L3_COLD_START, HOST_REGISTER_MAX_GB,
                                MEGAMOE_FP4_KEEP_TRTLLM)
