"""The feature registry: one row per feature folder. Everything plugin-wide is derived from these rows.

Row order is the order users see: doctor's feature list, the flag/env table, and the ledger. PATCHES (the
ledger) is the rows' patch declarations concatenated in that order, so patch ids, the generated
docs_internal/patch_manifest.md and the contract test follow from the rows alone.

Adding a feature: its folder (docs_internal/architecture.md says what goes in it) plus one row here.
"""

from __future__ import annotations

from ..cuda_graph_mem import feature as cuda_graph_mem, patches as cuda_graph_mem_patches
from ..declare import EnvVar, Feature, Flag, Patch
from ..hostmem import feature as hostmem, patches as hostmem_patches
from ..l3 import feature as l3, patches as l3_patches
from . import envs, feature as plugin, patches as plugin_patches

ROWS: tuple[tuple[Feature, tuple[Patch, ...]], ...] = (
    (plugin.FEATURE, plugin_patches.PATCHES),
    (l3.FEATURE, l3_patches.PATCHES),
    (cuda_graph_mem.FEATURE, cuda_graph_mem_patches.PATCHES),
    (hostmem.FEATURE, hostmem_patches.PATCHES),
)

FEATURES: tuple[Feature, ...] = tuple(f for f, _ in ROWS)
FEATURE_BY_NAME: dict[str, Feature] = {f.name: f for f in FEATURES}
PATCHES: tuple[Patch, ...] = tuple(p for _, patches in ROWS for p in patches)
FLAGS: tuple[Flag, ...] = tuple(flag for f in FEATURES for flag in f.flags)
FLAG_BY_NAME: dict[str, Flag] = {f.name: f for f in FLAGS}
# Every environment variable the plugin reads, in one table (DeepGEMM style): plugin-wide first, then by feature.
FEATURE_ENV_VARS: tuple[EnvVar, ...] = tuple(e for f in FEATURES for e in f.env)
ENV_VARS: tuple[EnvVar, ...] = envs.PLUGIN_ENV_VARS + FEATURE_ENV_VARS


def feature_of(item: Flag | EnvVar) -> Feature | None:
    """The feature that declares a flag or env var; None for a plugin-wide env var."""
    return next((f for f in FEATURES if item in f.flags or item in f.env), None)
