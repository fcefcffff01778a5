"""The HiCache backend's hook into the L3 metrics (l3/metrics.py): when, and under which labels, an attach pushes.

On exactly when SGLang's own storage metrics are on: ``storage_config.enable_storage_metrics``, which SGLang sets
from ``--enable-metrics`` (scheduler.py -> ``CacheInitParams.enable_metrics`` -> the assembler's
``enable_storage_metrics`` -> ``HiCacheStorageConfig``). No flag of its own.

Labels: SGLang's storage collector's (tp_rank, dp_rank, pp_rank, pp_size, attn_cp_rank, attn_cp_size,
storage_attachment.py ``_resolve_metrics_collector``), the fork's cp_rank / cp_size, the L3 rank and deployment,
then SGLang's ``--extra-metric-labels``. The CP rank and size come from the backend's ``cp_rank`` / ``cp_size``
when it has them (the L3-under-CP work may set them), else from the storage config SGLang hands the backend
(``attn_cp_rank`` / ``attn_cp_size``, from the attn_cp process group), else 0 of 1: a build or config without
CP fields is one CP rank.
"""

from __future__ import annotations

import logging

from .. import metrics as l3_metrics

log = logging.getLogger("sglang_glm_ext")

__all__ = ["enabled", "metric_labels", "attach", "detach"]


def enabled(storage_config) -> bool:
    return bool(getattr(storage_config, "enable_storage_metrics", False))


def _int(value, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _extra_metric_labels() -> dict:
    try:
        from sglang.srt.runtime_context import get_observability

        return dict(get_observability().extra_metric_labels or {})
    except Exception:  # noqa: BLE001 - nothing published (unit tests, tools): no extra labels
        return {}


def metric_labels(storage_config, *, l3_rank: int, deployment: str, cp_rank=None, cp_size=None,
                  extra: dict | None = None) -> dict:
    """The label set of one attach's L3 samples (see the module docstring for where each value comes from)."""
    sc = storage_config
    cp_rank = _int(cp_rank if cp_rank is not None else getattr(sc, "attn_cp_rank", None), 0)
    cp_size = _int(cp_size if cp_size is not None else getattr(sc, "attn_cp_size", None), 1)
    labels = {
        "tp_rank": _int(getattr(sc, "tp_rank", 0), 0),
        "dp_rank": _int(getattr(sc, "dp_rank", 0), 0),
        "pp_rank": _int(getattr(sc, "pp_rank", 0), 0),
        "pp_size": _int(getattr(sc, "pp_size", 1), 1),
        "attn_cp_rank": cp_rank,
        "attn_cp_size": cp_size,
        "cp_rank": cp_rank,
        "cp_size": cp_size,
        "l3_rank": l3_rank,
        "deployment": deployment,
    }
    for k, v in (extra if extra is not None else _extra_metric_labels()).items():
        labels.setdefault(str(k), v)  # never let an extra label overwrite a rank label
    return labels


def attach(backend) -> "l3_metrics.Registration | None":
    """Register the backend's store (and counters) with the process's L3 metrics; None when metrics are off.
    Called once the store is open (on_host_pools_registered). Never raises: metrics never fail an attach."""
    if not enabled(backend.storage_config):
        return None
    try:
        store = backend.store
        labels = metric_labels(backend.storage_config, l3_rank=backend.rank, deployment=backend.config.deployment_id,
                               cp_rank=getattr(backend, "cp_rank", None), cp_size=getattr(backend, "cp_size", None))
        return l3_metrics.register(backend, labels, store.stats, store.shared,
                                   backend_stats=backend.c.as_dict)
    except Exception:  # noqa: BLE001
        log.exception("sglang-glm-ext L3: metrics registration failed; serving goes on without L3 metrics")
        return None


def detach(registration) -> None:
    """The final push of this attach's counts, then it leaves (its store must still be open). Never raises."""
    if registration is None:
        return
    try:
        registration.close()
    except Exception:  # noqa: BLE001
        log.exception("sglang-glm-ext L3: metrics detach failed")
