"""l3 as users see it: --enable-cp-l3 / --cp-l3-config, SGLANG_CP_L3_COLD_START, and the config check at startup."""

from __future__ import annotations

import os
from typing import Any, Mapping

from ..declare import EnvVar, Feature, Flag, PluginFlagError
from .config import CP_L3_COLD_START, TEST_WRITE_DELAY_MS
from .tools import fio

ENABLE_CP_L3 = Flag("enable_cp_l3", "Enable the durable L3 disk tier for HiCache (needs --cp-l3-config).",
                    "bool", False, switch=True)
FIO_ENV = EnvVar(fio.ENV, "",
                 "fio binary that `sglang-glm-ext l3 bench` measures the disk's limit with, where `--fio` is not "
                 "given (else fio on PATH; none: the bench says so and keeps its own raw reference).")
CP_L3_CONFIG = Flag("cp_l3_config",
                    "Path to the L3 config (TOML or JSON); `sglang-glm-ext l3 example-config` writes one.",
                    "path", None)


def validate(values: Mapping[str, Any]) -> None:
    """A config without the switch, or the switch without a loadable config, stops the launch here."""
    if values[CP_L3_CONFIG.name] is not None and not values[ENABLE_CP_L3.name]:
        raise PluginFlagError(f"{CP_L3_CONFIG.cli} was given without {ENABLE_CP_L3.cli}; add {ENABLE_CP_L3.cli} "
                              "or drop it")
    if values[ENABLE_CP_L3.name]:
        check_config(values[CP_L3_CONFIG.name])


_CHECKED: set[int] = set()  # ids of configs (kept alive by L3Config.load_once) that passed check_config here


def check_config(path: str | None):
    """THE launch check of an L3 config, in this one place with its messages: it loads (``L3Config.load_once``:
    the flag validation, the flag translation and doctor of one process share the parse) and checks what serving
    will need from the disks (directories, write permission, budget vs free space, PLP). Returns the config;
    PluginFlagError names the problem and the fix. A config that passed is not checked again in this process."""
    from .config import L3Config, L3ConfigError

    if not path:
        raise PluginFlagError("--enable-cp-l3 needs --cp-l3-config PATH (write one: sglang-glm-ext l3 example-config)")
    if not os.path.isfile(path):
        raise PluginFlagError(f"--cp-l3-config {path!r}: no such file")
    try:
        cfg = L3Config.load_once(path)
    except (L3ConfigError, OSError) as exc:
        raise PluginFlagError(f"--cp-l3-config {path}: {exc}") from exc
    if id(cfg) in _CHECKED:
        return cfg
    _check_disks(cfg, path)
    _CHECKED.add(id(cfg))
    return cfg


def _check_disks(cfg, path: str) -> None:
    from .disk.plp import PlpRequiredError, check_plp, probe_plp
    from .disk.space import budget_fit, nearest_dir

    for what, p in [*((f"disks[{i}].path", d.path) for i, d in enumerate(cfg.disks)), ("index.path", cfg.index_path)]:
        if os.path.exists(p) and not os.path.isdir(p):
            raise PluginFlagError(f"--cp-l3-config {path}: {what} {p!r} exists and is not a directory")
        base = nearest_dir(p)
        if not os.access(base, os.W_OK | os.X_OK):
            raise PluginFlagError(f"--cp-l3-config {path}: {what} {p!r} is not writable by this user "
                                  f"({base} is not writable)")
    # The budget against the free space, before the model loads (the store would only find out at attach, when it
    # preallocates); the same computation doctor reports. The deployment's existing slabs count as space held.
    for row in budget_fit(cfg, path):
        if row["problem"]:
            raise PluginFlagError(row["problem"])
    if cfg.require_plp:
        for i, d in enumerate(cfg.disks):
            try:
                check_plp(probe_plp(nearest_dir(d.path), plp=cfg.plp, latency_probe=False), True)
            except PlpRequiredError as exc:
                raise PluginFlagError(f"--cp-l3-config {path}: disks[{i}]: {exc}") from exc


# The switch reaches SGLang as its own `dynamic` HiCache storage backend (l3/hooks.py, l3/patches.py); the
# launch-level checks that need the whole ServerArgs record (HiCache on, no explicit storage backend, writable
# paths, PLP) run there, before resolve_once.
FEATURE = Feature(
    "l3", "durable L3 disk tier for HiCache: SGLang's storage backend (one rank), engine, fsck, bench, demo",
    "163-180, 231-250, 251-281, 367-392, 393-425, 426-457, 458-486, 476-521",
    flags=(ENABLE_CP_L3, CP_L3_CONFIG), env=(CP_L3_COLD_START, TEST_WRITE_DELAY_MS, FIO_ENV),
    validate=validate,
)
