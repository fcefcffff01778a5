"""Thin hooks that put the L3 backend into SGLang's own storage mechanism (declared in ``l3/patches.py``).

``l3.translate_flags`` (BEFORE ``ServerArgs.resolve_once``): ``--enable-cp-l3 --cp-l3-config PATH`` becomes
``hicache_storage_backend="dynamic"`` + ``hicache_storage_backend_extra_config`` (``launch.plan_launch``) on the
record before SGLang resolves it, so SGLang's own checks run on the result (among them its refusal of storage
with ``--enable-kv-cache-sharding``). A registered backend name is not possible in 0.5.23 (the factory's
registered-name path ends in "Unknown built-in backend" and the CLI restricts the choices). Every way a record
is built reaches ``resolve_once``: ``launch_server`` / ``sglang serve``, ``--config`` YAML (parsed into the same
CLI namespace) and ``Engine(...)``.

``l3.translate_flags_cli`` (AFTER ``ServerArgs.from_cli_args``, after the plugin's own flag hook attached the
values: the patch declares ``after=("flags.from_cli",)`` and the ledger applies and checks that order): the same
translation for a command line, so a CLI user gets a one-line ``sglang-glm-ext: ...`` exit instead of a traceback
from ``resolve_once``.

``l3.storage_kv_dtype`` (AFTER ``HiCacheController._generate_storage_config``): SGLang's ``HiCacheStorageConfig``
has no KV dtype (0.5.23 TODO, issue #33268); for the plugin's backend only, the controller's device pool dtype is
added to the extra config, so e4m3 and e5m2 KV (both uint8 on the host) get different namespaces. The same hook adds
the ranks of the controller's storage MIN groups (``sync_group_ranks``): under DSA cache layer split the backend
attaches only where one of them holds every rank of its layer-shard group.

``l3.cp_storage_writers`` (AFTER the same method): stock 0.5.23 lets one rank write replicated (MLA/DSA) pages
(``is_storage_writer``: ``tp_rank == dcp_rank``; ``HiCacheController.backup_skip`` and the hybrid controller's
backup read it), so under CP one thread on one disk writes for the whole group and the ranks of a second node
write nothing. For the plugin's backend only, the config comes back as a subclass whose ``is_storage_writer`` is
True on every replica: SGLang hands every page to every replica's backup thread, and the backend writes exactly
the pages it owns (``owners.WriterPlan``), acknowledging the others as the owner's.
"""

from __future__ import annotations

import sys

from ..declare import PluginFlagError, carried_values
from .feature import CP_L3_CONFIG, ENABLE_CP_L3
from .hicache import extra_config
from .launch import plan_launch

__all__ = ["translate", "hook_resolve_once", "hook_from_cli_args", "hook_storage_config", "hook_cp_writers",
           "sync_group_ranks", "server_launched", "TRANSLATED_ATTR", "ALL_REPLICAS_WRITE_ATTR"]

TRANSLATED_ATTR = "_glm_ext_l3"  # bookkeeping on the record (pickled to schedulers): what the plugin set
_LAUNCHED = False
ALL_REPLICAS_WRITE_ATTR = extra_config.ALL_REPLICAS_WRITE_ATTR


def server_launched() -> bool:
    """Whether a server/Engine launch was resolved in this process (the CPU stand-ins refuse to install then)."""
    return _LAUNCHED


def translate(server_args) -> bool:
    """Turn the plugin's L3 flags on ``server_args`` into SGLang's storage-backend fields, once. True when it did.

    Raises PluginFlagError (a ValueError; the CLI hook turns it into a one-line exit) before serving where
    ``launch.plan_launch`` refuses the launch (it says what it checks).
    """
    if getattr(server_args, "_resolution_finished", False) or getattr(server_args, TRANSLATED_ATTR, None):
        return False
    values = carried_values(server_args)
    plan = plan_launch(ENABLE_CP_L3.value_in(values), CP_L3_CONFIG.value_in(values), server_args)
    if plan is None:
        return False
    server_args.hicache_storage_backend = "dynamic"
    server_args.hicache_storage_backend_extra_config = plan.extra_config_json()
    setattr(server_args, TRANSLATED_ATTR, {"extra_config": dict(plan.extra_config),
                                           "deployment_id": plan.deployment_id})
    return True


# ---- hooks (declared in l3/patches.py) ----

def hook_resolve_once(self, *args, **kwargs):
    """BEFORE ServerArgs.resolve_once: translate the L3 flags while the record is still the operator's input."""
    global _LAUNCHED
    if getattr(self, "_launch_command", None):
        standins = sys.modules.get("sglang_glm_ext.l3.demo.cpu_standins")
        if standins is not None and standins.installed():
            raise PluginFlagError("sglang-glm-ext: the CPU demo/test stand-ins for SGLang's GPU copy ops are "
                                  "installed in this process; a server must not run on them")
        _LAUNCHED = True
    translate(self)
    return None


def hook_from_cli_args(server_args, cls, ns, *args, **kwargs):
    """AFTER ServerArgs.from_cli_args, after the plugin's flag hook attached the values (the patch's ``after``):
    translate now, so a command-line user gets one clear line, not a traceback from resolve_once."""
    try:
        translate(server_args)
    except PluginFlagError as exc:
        raise SystemExit(f"sglang-glm-ext: {exc}") from None
    return server_args


def hook_storage_config(result, self, *args, **kwargs):
    """AFTER HiCacheController._generate_storage_config: give the plugin's backend the logical KV dtype, and the
    ranks of the groups the controller's storage MINs reduce over (for the attach check of a part group)."""
    extra = getattr(result, "extra_config", None)
    if isinstance(extra, dict) and extra.get("backend_name") == extra_config.BACKEND_NAME:
        dev = getattr(self, "mem_pool_device", None)
        dtype = getattr(dev, "dtype", None)
        if dtype is not None:
            extra["kv_dtype"] = str(dtype).removeprefix("torch.")
            extra["kv_device_pool"] = type(dev).__name__
        groups = sync_group_ranks(self)
        if groups is not None:
            extra[extra_config.SYNC_GROUPS_KEY] = groups
    return result


def sync_group_ranks(controller) -> "list[list[int]] | None":
    """The global ranks of each group ``HiCacheController._create_sync_groups`` (``cache_controller.py:404-431``)
    builds its storage MIN groups from, in its order (attention CP and attention TP, else TP; then PP; trivial and
    repeated rank sets left out); None when they cannot be read (no process group initialised)."""
    import torch.distributed as dist

    cp, atp, tp, pp = (getattr(controller, n, None) for n in ("attn_cp_group", "attn_tp_group", "tp_group",
                                                              "pp_group"))
    base = [cp, atp] if cp is not None or atp is not None else [tp]
    if pp is not None:
        base.append(pp)
    out: list[list[int]] = []
    try:
        for group in base:
            if group is None or dist.get_world_size(group=group) == 1:
                continue
            ranks = [int(r) for r in dist.get_process_group_ranks(group)]
            if ranks not in out:
                out.append(ranks)
    except Exception:  # noqa: BLE001 - unreadable groups: the attach refuses what needs them
        return None
    return out


_ALL_WRITER_CLASSES: dict = {}


def _all_replicas_write_class(base):
    cls = _ALL_WRITER_CLASSES.get(base)
    if cls is None:
        cls = type(f"{base.__name__}AllReplicasWrite", (base,), {
            "__doc__": "HiCacheStorageConfig of the L3 backend: every replica writes; the backend keeps one owner "
                       "per page (sglang_glm_ext l3.cp_storage_writers).",
            "is_storage_writer": property(lambda self: True),
            ALL_REPLICAS_WRITE_ATTR: True,
        })
        _ALL_WRITER_CLASSES[base] = cls
    return cls


def hook_cp_writers(result, self, *args, **kwargs):
    """AFTER HiCacheController._generate_storage_config: for the plugin's backend and replicated (MLA/DSA) pages,
    every replica is a storage writer to SGLang. Invariant: only the plugin's backend sees the rewritten config
    (any other backend keeps SGLang's one writer), and the result is equal field by field to SGLang's."""
    import dataclasses

    extra = getattr(result, "extra_config", None)
    if not (isinstance(extra, dict) and extra.get("backend_name") == extra_config.BACKEND_NAME):
        return result
    if not getattr(result, "is_mla_model", False) or getattr(result, "dcp_size", 1) != 1:
        return result  # MHA: every rank writes already; DCP: not served (the backend refuses it)
    if getattr(result, ALL_REPLICAS_WRITE_ATTR, False) or not dataclasses.is_dataclass(result):
        return result
    cls = _all_replicas_write_class(type(result))
    return cls(**{f.name: getattr(result, f.name) for f in dataclasses.fields(result) if f.init})
