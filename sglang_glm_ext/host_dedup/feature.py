"""host_dedup as users see it: `--hicache-host-dedup {auto,on,off}` (default auto; see plan.MODES)."""

from __future__ import annotations

from typing import Any, Mapping

from ..declare import Feature, Flag, PluginFlagError
from .plan import MODES, resolve_mode

HICACHE_HOST_DEDUP = Flag(
    "hicache_host_dedup",
    "One host copy of replicated MLA/DSA KV per node: auto, on or off (unset: auto, which stays off until a "
    "multi-GPU benchmark decides; docs_internal/host_dedup.md). `doctor` says which pools run deduplicated.",
    "choice", None, choices=MODES, switch_on=("on",))


def validate(values: Mapping[str, Any]) -> None:
    value = values.get(HICACHE_HOST_DEDUP.name)
    if value is not None and str(value).strip().lower() not in MODES:
        raise PluginFlagError(f"{HICACHE_HOST_DEDUP.cli} {value}: expected one of {', '.join(MODES)}")


def asked_mode(server_args: Any = None) -> str:
    """The mode this launch asked for ('auto' when unset), read from the carried plugin values."""
    from ..declare import carried_values

    return resolve_mode(HICACHE_HOST_DEDUP.value_in(carried_values(server_args)))


FEATURE = Feature(
    "host_dedup", "one host copy and one disk read per node for replicated MLA/DSA KV (HiCache + L3)", "-",
    flags=(HICACHE_HOST_DEDUP,), validate=validate,
)
