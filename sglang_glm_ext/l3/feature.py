"""l3 as users see it: --enable-cp-l3 / --cp-l3-config, SGLANG_CP_L3_COLD_START, and the config check at startup."""

from __future__ import annotations

from typing import Any, Mapping

from ..declare import EnvVar, Feature, Flag
from .config import CP_L3_COLD_START, TEST_WRITE_DELAY_MS
from .launch import plan_launch
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
    """A config without the switch, or the switch without a config that passes the launch check, stops the launch
    here (``launch.plan_launch``, which the flag translation and doctor ask too)."""
    plan_launch(values[ENABLE_CP_L3.name], values[CP_L3_CONFIG.name])


# The switch reaches SGLang as its own `dynamic` HiCache storage backend (l3/hooks.py, l3/patches.py); the
# launch-level checks that need the whole ServerArgs record (HiCache on, no explicit storage backend, the modes not
# served) run there, in the same plan_launch, before resolve_once.
FEATURE = Feature(
    "l3", "durable L3 disk tier for HiCache: SGLang's storage backend (one rank), engine, fsck, bench, demo",
    "163-180, 231-250, 251-281, 367-392, 393-425, 426-457, 458-486, 476-521",
    flags=(ENABLE_CP_L3, CP_L3_CONFIG), env=(CP_L3_COLD_START, TEST_WRITE_DELAY_MS, FIO_ENV),
    validate=validate,
)
