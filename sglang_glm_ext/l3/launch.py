"""What ``--enable-cp-l3 --cp-l3-config PATH`` come to for one launch, worked out in one place: :func:`plan_launch`.

The flag check (``feature.validate``), the translation into SGLang's storage-backend fields (``hooks.translate``)
and doctor all ask it, so they refuse in the same words. It reads the config file once per process: the bytes it
parses are the bytes the extra config's digest names (the backend checks that digest at attach), kept by the file's
absolute path and its stat, so an edited file is read again. A config whose disks passed the launch check is not
checked again while the file is unchanged.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping

from ..declare import PluginFlagError
from .config import CP_L3_COLD_START, TEST_WRITE_DELAY_MS, L3Config, L3ConfigError, decode
from .hicache import extra_config, parts

__all__ = ["L3LaunchPlan", "plan_launch", "load_config"]

NEEDS_CONFIG = "--enable-cp-l3 needs --cp-l3-config PATH (write one: sglang-glm-ext l3 example-config)"


@dataclass(frozen=True)
class L3LaunchPlan:
    """One launch with L3 on: the config it serves and what SGLang is handed for it."""

    config_path: str  # --cp-l3-config as given
    config: L3Config  # parsed from the bytes `digest` names; its disks passed the launch check
    digest: str  # extra_config.digest_of(the file's bytes)
    # SGLang's hicache_storage_backend_extra_config: the backend's keys plus the user's SGLang controller keys
    extra_config: Mapping[str, Any]

    @property
    def deployment_id(self) -> str:
        return self.config.deployment_id

    def extra_config_json(self) -> str:
        return json.dumps(dict(self.extra_config), sort_keys=True)


def plan_launch(enabled: bool, config_path: str | None, server_args: Any = None) -> L3LaunchPlan | None:
    """THE launch check of the L3 flags: None when L3 is off, else the plan. ``server_args`` (a ServerArgs record
    before resolution, or None for the flag values alone) adds the checks of SGLang's own arguments and the user's
    extra config keys. PluginFlagError names each problem and its fix: the config without the switch, the switch
    without a loadable config; HiCache off, a storage backend already named, KV-cache sharding or decode context
    parallelism (each with its reason), buffer_only host memory; a config that is missing, invalid, unwritable,
    over its free space, or requires PLP on a disk not known safe."""
    if config_path is not None and not enabled:
        raise PluginFlagError("--cp-l3-config was given without --enable-cp-l3; add --enable-cp-l3 or drop it")
    if not enabled:
        return None
    if server_args is not None:
        _check_server_args(server_args)
    if not config_path:
        raise PluginFlagError(NEEDS_CONFIG)
    read = _read(config_path)
    if not read.disks_checked:
        _check_disks(read.config, config_path)
        read.disks_checked = True
    user = _user_extra(getattr(server_args, "hicache_storage_backend_extra_config", None))
    try:
        extra = extra_config.build(config_path, user, digest=read.digest)
    except ValueError as exc:
        raise PluginFlagError(str(exc)) from exc
    return L3LaunchPlan(config_path, read.config, read.digest, MappingProxyType(extra))


def load_config(path: str) -> L3Config:
    """The config at ``path`` as the launch reads it (the same read), without the launch's checks: doctor shows its
    disks whether or not L3 is switched on. PluginFlagError names what does not load."""
    return _read(path).config


# ---- reading the file once ----

@dataclass
class _Read:
    key: tuple  # the file's stat when read, and the env vars the parse reads (_key)
    config: L3Config
    digest: str
    disks_checked: bool = False  # the launch check of its disks passed (not cached when it fails)


_READS: dict[str, _Read] = {}  # by absolute path: relative disk paths in a config resolve against its folder


def _key(st: os.stat_result) -> tuple:
    return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size, CP_L3_COLD_START.raw(), TEST_WRITE_DELAY_MS.raw()


def _read(path: str) -> _Read:
    if not os.path.isfile(path):  # the launch and doctor say it in these words, so doctor says it once
        raise PluginFlagError(f"--cp-l3-config {path}: no such file; give the path of an L3 config "
                              f"(sglang-glm-ext l3 example-config --dir DIR writes one)")
    where = os.path.abspath(path)
    kept = _READS.get(where)
    if kept is not None:
        try:
            if _key(os.stat(where)) == kept.key:
                return kept
        except OSError:
            pass  # gone: the read below says so
    try:
        try:
            with open(where, "rb") as f:
                st, raw = os.fstat(f.fileno()), f.read()
        except OSError as e:
            raise L3ConfigError(f"cannot read it: {e.strerror or e}; make it readable by the user that runs "
                                f"the server") from e
        # L3Config's public loader of parsed data: the bytes read here are parsed, not the file again.
        cfg = L3Config.from_dict(decode(raw, path), source=path, base_dir=os.path.dirname(where))
    except L3ConfigError as exc:
        raise PluginFlagError(f"--cp-l3-config {path}: {exc}") from exc
    read = _READS[where] = _Read(_key(st), cfg, extra_config.digest_of(raw))
    return read


# ---- the checks ----

def _check_server_args(server_args: Any) -> None:
    if not getattr(server_args, "enable_hierarchical_cache", False):
        raise PluginFlagError("--enable-cp-l3 needs --enable-hierarchical-cache: L3 is HiCache's storage tier, "
                              "below the host-memory (L2) cache")
    named = getattr(server_args, "hicache_storage_backend", None)
    if named is not None:
        raise PluginFlagError(f"--enable-cp-l3 selects the HiCache storage backend itself; drop "
                              f"--hicache-storage-backend {named}")
    # --enable-dsa-cache-layer-split is served: each CP rank spills and reloads its own layers under a namespace
    # naming its part (hicache/parts.py, plan.py; docs_internal/l3_cp.md). The two modes below stay refused.
    layout = getattr(server_args, "hicache_mem_layout", None) or "layer_first"
    if getattr(server_args, "enable_dsa_cache_layer_split", False) and layout != "layer_first":
        raise PluginFlagError(
            f"--enable-cp-l3 with --enable-dsa-cache-layer-split needs --hicache-mem-layout layer_first, not {layout}: "
            "SGLang 0.5.23 writes a layer-sharded DSA indexer host pool back only in layer_first (pool_host/dsa.py "
            "_backup_from_device_per_layer: page_first needs a per-layer LF->PF kernel it lacks; direct I/O is "
            "layer_first only), so the server would fail at its first write-back")
    if getattr(server_args, "enable_kv_cache_sharding", False):
        raise PluginFlagError(f"--enable-cp-l3 does not serve --enable-kv-cache-sharding: "
                              f"{parts.KV_SHARDING_REFUSED}")
    if int(getattr(server_args, "dcp_size", 1) or 1) > 1:
        raise PluginFlagError(f"--enable-cp-l3 does not serve decode context parallelism (--dcp-size > 1): "
                              f"{parts.DCP_REFUSED}")
    if getattr(server_args, "hicache_host_memory_mode", "cache") != "cache":
        raise PluginFlagError("--enable-cp-l3 needs --hicache-host-memory-mode cache (buffer_only is not served)")


def _check_disks(cfg: L3Config, path: str) -> None:
    from .disk.plp import PlpRequiredError, check_plp, probe_plp
    from .disk.probe import probe_config
    from .disk.space import budget_fit, nearest_dir

    # Every directory the engine will create and write in, proven by doing it in miniature (doctor reports the same
    # probes): a bad path stops here, before the model loads, not at attach.
    for probe in probe_config(cfg):
        if probe.problem:
            raise PluginFlagError(f"--cp-l3-config {path}: {probe.problem}")
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


def _user_extra(raw: Any) -> dict:
    """The user's --hicache-storage-backend-extra-config (SGLang's controller keys only, checked by the build)."""
    if raw in (None, ""):
        return {}
    if isinstance(raw, dict):
        return dict(raw)
    if isinstance(raw, str) and raw.startswith("@"):
        raise PluginFlagError("--hicache-storage-backend-extra-config @FILE cannot be combined with --enable-cp-l3; "
                              f"pass SGLang's keys inline as JSON ({', '.join(extra_config.SGLANG_CONTROLLER_KEYS)})")
    try:
        val = json.loads(raw)
    except (TypeError, ValueError) as exc:
        raise PluginFlagError(f"--hicache-storage-backend-extra-config is not JSON: {exc}") from exc
    if not isinstance(val, dict):
        raise PluginFlagError("--hicache-storage-backend-extra-config must be a JSON object")
    return val
