"""l3 as users see it: --enable-cp-l3 / --cp-l3-config, SGLANG_CP_L3_COLD_START, and the config check at startup."""

from __future__ import annotations

import os
from typing import Any, Mapping

from ..declare import Feature, Flag, PluginFlagError
from .config import CP_L3_COLD_START, L3Config

ENABLE_CP_L3 = Flag("enable_cp_l3", "Enable the durable L3 disk tier for HiCache (needs --cp-l3-config).",
                    "bool", False, switch=True)
CP_L3_CONFIG = Flag("cp_l3_config",
                    "Path to the L3 config (TOML or JSON); `sglang-glm-ext l3 example-config` writes one.",
                    "path", None)


def validate(values: Mapping[str, Any]) -> None:
    """A config without the switch, or the switch without a loadable config, stops the launch here."""
    if values[CP_L3_CONFIG.name] is not None and not values[ENABLE_CP_L3.name]:
        raise PluginFlagError(f"{CP_L3_CONFIG.cli} was given without {ENABLE_CP_L3.cli}; add {ENABLE_CP_L3.cli} "
                              "or drop it")
    if values[ENABLE_CP_L3.name]:
        _check_config(values[CP_L3_CONFIG.name])


def _check_config(path: str | None) -> None:
    if not path:
        raise PluginFlagError("--enable-cp-l3 needs --cp-l3-config PATH (write one: sglang-glm-ext l3 example-config)")
    if not os.path.isfile(path):
        raise PluginFlagError(f"--cp-l3-config {path!r}: no such file")
    try:
        L3Config.load(path)
    except Exception as exc:
        raise PluginFlagError(f"--cp-l3-config {path!r}: {exc}") from exc


# The switch reaches SGLang as its own `dynamic` HiCache storage backend (hicache/hooks.py, l3/patches.py); the
# launch-level checks that need the whole ServerArgs record (HiCache on, no explicit storage backend, writable
# paths, PLP) run there, before resolve_once.
FEATURE = Feature(
    "l3", "durable L3 disk tier for HiCache: SGLang's storage backend (one rank), engine, fsck, bench, demo",
    "163-180, 231-250, 251-281, 367-392, 393-425, 426-457, 458-486, 476-521",
    flags=(ENABLE_CP_L3, CP_L3_CONFIG), env=(CP_L3_COLD_START,),
    validate=validate,
)
