"""The plugin's features: what each carries, how it is switched on, and whether it can work here.

"applied" (a patch is in SGLang's code) and "active" (the user switched the feature on for this launch) are
different questions; `doctor` reports both.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Feature:
    name: str
    title: str
    seed_lines: str
    flags: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    # Set when this build cannot serve the feature at all, whatever the patches say.
    unavailable: str = ""
    # Infrastructure and safety checks run whenever the plugin does; a user cannot switch them off.
    always_on: bool = False


FEATURES: tuple[Feature, ...] = (
    Feature("flags", "plugin flags on SGLang's CLI, Engine(...) and --config YAML", "-", always_on=True),
    Feature(
        "l3", "durable L3 disk tier for HiCache: SGLang's storage backend (one rank), engine, fsck, bench, demo",
        "163-180, 231-250, 251-281, 367-392, 393-425, 426-457, 458-486, 476-521",
        flags=("enable_cp_l3", "cp_l3_config"), env=("SGLANG_CP_L3_COLD_START",),
    ),
    Feature("cg_mem", "CUDA-graph static-buffer and graph-pool memory attribution", "152-162",
            flags=("log_cuda_graph_buffers",), env=("SGLANG_LOG_CG_BUFFERS",)),
    Feature("host_register", "cudaHostRegister ceiling check for host KV pools", "297-321",
            env=("SGLANG_GLM_EXT_HOST_REGISTER_MAX_GB",), always_on=True),
)
FEATURE_BY_NAME = {f.name: f for f in FEATURES}


def why_unavailable(name: str) -> str:
    """'' when the feature can work in this process, else the reason it cannot."""
    from . import ledger_state

    feature = FEATURE_BY_NAME[name]
    if feature.unavailable:
        return feature.unavailable
    ledger = ledger_state()
    if ledger is None:
        return "the plugin did not register (SGLANG_GLM_EXT_DISABLE=1, or SGLang's load_plugins() was not called)"
    bad = [s for s in ledger.status.values() if s.patch.feature == name and s.state.value != "applied"]
    if bad:
        return "; ".join(f"patch {s.patch.id} {s.state.value}: {s.detail}" for s in bad)
    return ""


def require_available(name: str) -> None:
    from .flags import PluginFlagError

    reason = why_unavailable(name)
    if reason:
        raise PluginFlagError(f"feature '{name}' cannot work: {reason}")


def is_active(name: str, server_args=None) -> bool:
    """Whether the user switched `name` on for this launch (flags or env vars)."""
    from . import flags

    return active_in(name, flags.get(server_args))


def active_in(name: str, values: dict) -> bool:
    """Whether `name` is on given resolved flag values (flags.get() folds the env vars in)."""
    if name == "l3":
        return bool(values.get("enable_cp_l3"))
    if name == "cg_mem":
        return bool(values.get("log_cuda_graph_buffers"))
    if FEATURE_BY_NAME[name].always_on:
        return True
    raise KeyError(name)
