"""Whether each feature can work in this process, and the refusal of a launch that switched on one that cannot.

A feature cannot work when this build does not serve it (`Feature.unavailable`), when the plugin did not
register, or when one of its patches is not applied (skipped or failed, as the ledger says; demo-tier patches,
which register() never applies, do not count).
"""

from __future__ import annotations

from typing import Any, Mapping

from ..declare import Feature, PluginFlagError, Tier
from ..patching.ledger import State
from .register import ledger_state
from .registry import FEATURES


def why_unavailable(feature: Feature) -> str:
    """'' when `feature` can work in this process, else the reason it cannot."""
    if feature.unavailable:
        return feature.unavailable
    ledger = ledger_state()
    if ledger is None:
        return "the plugin did not register (SGLANG_GLM_EXT_DISABLE=1, or SGLang's load_plugins() was not called)"
    # Demo-tier patches (CPU stand-ins) are never applied by register(): they say nothing about serving.
    bad = [s for s in ledger.status.values()
           if s.patch.feature == feature and s.patch.tier is not Tier.DEMO and s.state is not State.APPLIED]
    if bad:
        # One reason once: three or more patches skipped for the same reason (the CPU serving tier off) are
        # named together; otherwise each patch says its own.
        groups: dict[tuple[str, str], list[str]] = {}
        for s in bad:
            groups.setdefault((s.state.value, s.detail), []).append(s.patch.id)
        parts = []
        for (state, detail), ids in groups.items():
            if len(ids) > 2:
                parts.append(f"{len(ids)} patches ({', '.join(ids[:2])}, ...) {state}: {detail}")
            else:
                parts.extend(f"patch {i} {state}: {detail}" for i in ids)
        return "; ".join(parts)
    return ""


def require_available(feature: Feature) -> None:
    reason = why_unavailable(feature)
    if reason:
        raise PluginFlagError(f"feature '{feature.name}' cannot work: {reason}")


def require_switched_on_available(values: Mapping[str, Any], server_args: Any = None) -> None:
    """A feature switched on (by flag, env var, or, given `server_args`, SGLang's own arguments through its
    `active_when`) whose patches did not land refuses the launch, loudly.
    Always-on features are checks, not switches: they never refuse a launch here."""
    for feature in FEATURES:
        if not feature.always_on and feature.switched_on(values, server_args):
            require_available(feature)
