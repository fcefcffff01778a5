"""SGLANG_CP_L3_COLD_START, the one feature env var declared outside its feature's folder.

l3/store.py reads it as `envs.CP_L3_COLD_START`, and the L3 engine's files are being fixed on another branch, so
the declaration stays on this path until that lands; l3/feature.py lists it as the L3 feature's env var. Every
other env var is declared by its feature (`<feature>/feature.py`) or, plugin-wide, in plugin/envs.py; the one
table of all of them is plugin/registry.py ENV_VARS (README and `sglang-glm-ext flags` are generated from it).
"""

from __future__ import annotations

from .declare import EnvVar

CP_L3_COLD_START = EnvVar(
    "SGLANG_CP_L3_COLD_START", "",
    "Overrides the L3 config's cold_start ('clear' or 'load') for this launch.",
)
