"""The plugin-wide environment variables: the kill switch and the force switch (no feature owns them)."""

from __future__ import annotations

from ..declare import EnvVar

DISABLE = EnvVar(
    "SGLANG_GLM_EXT_DISABLE", "0",
    "Kill switch: 1 = the plugin loads but applies no patch and registers no flag (A/B whether a problem is ours).",
)
FORCE_UNSUPPORTED = EnvVar(
    "SGLANG_GLM_EXT_FORCE_UNSUPPORTED", "0",
    "1 = apply feature patches on an SGLang version outside the supported range, at your own risk.",
)

PLUGIN_ENV_VARS: tuple[EnvVar, ...] = (DISABLE, FORCE_UNSUPPORTED)
