"""The feature registry: one row per feature (one feature folder each). Everything plugin-wide is derived from these
rows.

Row order is the order users see: doctor's feature list, the flag/env table, and the ledger. PATCHES (the
ledger) is the rows' patch declarations concatenated in that order, so patch ids, the generated
docs_internal/patch_manifest.md and the contract test follow from the rows alone.

Adding a feature: its folder (docs_internal/architecture.md says what goes in it) plus one row in ROWS, and its
doctor.py's REPORTER in DOCTOR_PARTS when it has one.
"""

from __future__ import annotations

from ..cpu_serve import doctor as cpu_serve_doctor, feature as cpu_serve, patches as cpu_serve_patches
from ..cuda_graph_mem import feature as cuda_graph_mem, patches as cuda_graph_mem_patches
from ..declare import DoctorReporter, EnvVar, Feature, Flag, Patch
from ..gpu_bringup import doctor as gpu_bringup_doctor, feature as gpu_bringup, patches as gpu_bringup_patches
from ..host_dedup import doctor as host_dedup_doctor, feature as host_dedup, patches as host_dedup_patches
from ..host_register import feature as host_register, patches as host_register_patches
from ..hugepages import doctor as hugepages_doctor, feature as hugepages, patches as hugepages_patches
from ..l3 import doctor as l3_doctor, feature as l3, patches as l3_patches
from ..megamoe import doctor as megamoe_doctor, feature as megamoe, patches as megamoe_patches
from . import envs, feature as plugin, patches as plugin_patches

ROWS: tuple[tuple[Feature, tuple[Patch, ...]], ...] = (
    (plugin.FEATURE, plugin_patches.PATCHES),
    (l3.FEATURE, l3_patches.PATCHES),
    (host_dedup.FEATURE, host_dedup_patches.PATCHES),
    (cuda_graph_mem.FEATURE, cuda_graph_mem_patches.PATCHES),
    (host_register.FEATURE, host_register_patches.PATCHES),
    (hugepages.FEATURE, hugepages_patches.PATCHES),
    (megamoe.FEATURE, megamoe_patches.PATCHES),
    (cpu_serve.FEATURE, cpu_serve_patches.PATCHES),
    (gpu_bringup.FEATURE, gpu_bringup_patches.PATCHES),
)

# One entry per folder that adds to doctor's report (GPU listing is plugin-wide: plugin/doctor.py), in the order
# its text lines appear.
DOCTOR_PARTS: tuple[DoctorReporter, ...] = (
    megamoe_doctor.REPORTER,
    hugepages_doctor.REPORTER,
    l3_doctor.REPORTER,
    host_dedup_doctor.REPORTER,
    cpu_serve_doctor.REPORTER,
    gpu_bringup_doctor.REPORTER,
)

FEATURES: tuple[Feature, ...] = tuple(f for f, _ in ROWS)
FEATURE_BY_NAME: dict[str, Feature] = {f.name: f for f in FEATURES}
PATCHES: tuple[Patch, ...] = tuple(p for _, patches in ROWS for p in patches)
FLAGS: tuple[Flag, ...] = tuple(flag for f in FEATURES for flag in f.flags)
FLAG_BY_NAME: dict[str, Flag] = {f.name: f for f in FLAGS}
# SGLang's own arguments that switch a feature on (Feature.sglang_args); doctor accepts them as options.
SGLANG_ARGS: tuple[str, ...] = tuple(dict.fromkeys(a for f in FEATURES for a in f.sglang_args))
# Every environment variable the plugin reads, in one table (DeepGEMM style): plugin-wide first, then by feature.
FEATURE_ENV_VARS: tuple[EnvVar, ...] = tuple(e for f in FEATURES for e in f.env)
ENV_VARS: tuple[EnvVar, ...] = envs.PLUGIN_ENV_VARS + FEATURE_ENV_VARS


def feature_of(item: Flag | EnvVar) -> Feature | None:
    """The feature that declares a flag or env var; None for a plugin-wide env var."""
    return next((f for f in FEATURES if item in f.flags or item in f.env), None)
