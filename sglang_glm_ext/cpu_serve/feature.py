"""cpu_serve as users see it: ``SGLANG_GLM_EXT_CPU_SERVE=1`` serves SGLang's real server on a machine without an
accelerator (``--device cpu`` with ``SGLANG_USE_CPU_ENGINE=1``); refused, with one line, anywhere else."""

from __future__ import annotations

from typing import Any, Mapping

from ..declare import EnvVar, Feature, refuse_tier
# The switch is declared where the gate reads it; re-exported here, the feature's face.
from .gate import CPU_SERVE, USE_CPU_ENGINE, refusal_reason  # noqa: F401

PERTURB_LOADS = EnvVar(
    "SGLANG_GLM_EXT_CPU_SERVE_PERTURB_LOADS", "0",
    "TEST-ONLY negative control of the CPU serving mode: 1 = every host->device KV load (HiCache L2/L3 hits) is "
    "written back negated and scaled, so a comparison of outputs must fail. Never set it to serve.",
)


def validate(values: Mapping[str, Any]) -> None:
    """With the mode on: refuse (one line) where it cannot run; the --device check needs the record (hooks.py)."""
    refuse_tier(CPU_SERVE, refusal_reason)


def _active(_server_args: Any) -> bool:
    """Switched on by its env var (read here, as every SGLang process does); `device` is what doctor may be given
    (`doctor --device cpu`) to check the launch's --device too."""
    try:
        return CPU_SERVE.get_bool()
    except ValueError:
        return False


FEATURE = Feature(
    "cpu_serve", "SGLang's real server on a CPU-only machine (tiny GLM models, HiCache + L3): stand-ins for what "
    "0.5.23 lacks there", "-",
    env=(CPU_SERVE, PERTURB_LOADS), validate=validate, active_when=_active, sglang_args=("device",),
)
