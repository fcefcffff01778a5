"""L3 metrics in SGLang's Prometheus namespace: the fork's ``sglang:cp_l3_*`` names (seed 339-366) and new ones beside
them, fed from the store's ``stats()`` (and the HiCache backend's counters) by a push thread, off the data path.

* ``METRICS``: every metric, its type, the labels it carries and its meaning. ``docs/metrics.md`` is generated from
  it (``python -m sglang_glm_ext.l3.hicache.metrics --reference docs/metrics.md``).
* :func:`store_samples` / :func:`backend_samples`: a pure mapping from a ``stats()`` dict to ``(name, labels,
  value)`` samples, cumulative; :class:`_Source` turns them into increments (a counter only ever goes up).
* The process registry: families made once per process, sources keyed by label values, one daemon push thread.
  It is also the thread that feeds the latency histograms (``engine/latency.py`` records, this thread observes).

prometheus_client is imported at first use, never at import time: SGLang picks its multiprocess value store before
that. Why each choice (labels, switch, multiprocess modes, deltas): ``docs_internal/l3_metrics.md``.
"""

from __future__ import annotations

import itertools
import logging
import sys
import threading
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

from ..engine import latency

log = logging.getLogger(__name__)

__all__ = ["METRICS", "MetricSpec", "BASE_LABELS", "IDENTITY_LABELS", "INFO_LABELS", "PUSH_INTERVAL_S",
           "store_samples", "backend_samples", "register", "Registration", "push_all", "registered_sources",
           "enabled", "metric_labels", "attach", "detach", "reference"]

PUSH_INTERVAL_S = 1.0  # as the fork's collector (~1 s): a dashboard resolution, not a data-path rate

# The labels of every series dashboards already read (SGLang's storage collector's tp/dp/pp and attn_cp_*, the
# fork's cp_rank / cp_size, the L3 rank and the deployment): kept on those series. SGLang's --extra-metric-labels
# keys follow, in the order given at the first registration of the process.
BASE_LABELS = ("tp_rank", "dp_rank", "pp_rank", "pp_size", "attn_cp_rank", "attn_cp_size", "cp_rank", "cp_size",
               "l3_rank", "deployment")
# New series carry only what tells one process's series from another's; the constants are in sglang:cp_l3_info.
IDENTITY_LABELS = ("tp_rank", "dp_rank", "pp_rank", "attn_cp_rank", "l3_rank")
INFO_LABELS = ("deployment", "pp_size", "attn_cp_size", "cp_size")
DEPRECATED_UNTIL = "0.2.0"  # deprecated series are still exported by every 0.1.x release


@dataclass(frozen=True)
class MetricSpec:
    name: str                     # as exposed ("..._total" for counters)
    type: str                     # "counter" | "gauge" | "histogram"
    doc: str
    labels: tuple[str, ...] = ()  # the sample's own labels
    fork: bool = False            # a name the fork's dashboards use: never rename
    base: tuple[str, ...] = BASE_LABELS  # the process labels it carries (before the extra labels)
    deprecated: str = ""          # its replacement: exported until DEPRECATED_UNTIL, then removed


def _c(name, doc, labels=(), fork=False, **kw):
    return MetricSpec(f"sglang:cp_l3_{name}_total", "counter", doc, labels, fork, **kw)


def _g(name, doc, labels=(), fork=False, **kw):
    return MetricSpec(f"sglang:cp_l3_{name}", "gauge", doc, labels, fork, **kw)


def _new(kind, name, doc, labels=()):
    """A metric added after the fork: a unit word in its name, only the identity labels."""
    if kind == "histogram":
        return MetricSpec(f"sglang:cp_l3_{name}", kind, doc, labels, base=IDENTITY_LABELS)
    return (_c if kind == "counter" else _g)(name, doc, labels, base=IDENTITY_LABELS)


METRICS: tuple[MetricSpec, ...] = (
    # ---- the fork's names and meanings
    _g("used_slots", "L3 slots holding a page, per payload kind (slab occupancy).", ("payload",), fork=True),
    _g("total_slots", "L3 slots of this rank's slab, per payload kind.", ("payload",), fork=True),
    _g("inflight_spill", "Pages accepted by spill and not yet durable or dropped (staged, queued or being written).",
       fork=True),
    _g("inflight_reload", "Pages inside a reload call right now (read into host memory, verified where they "
       "landed).", fork=True),
    _g("queue_depth", "Depth of the store's background queues: write (staged pages waiting for the writer), control "
       "(free / clear / add-kind messages), touch (LRU updates from reloads).", ("queue",), fork=True),
    _c("spill_pages", "Pages made durable in L3 (payload fdatasync'ed and index entry committed).", fork=True),
    _c("reload_pages", "Pages served by reload into host memory (verified, or copied from staging).", fork=True),
    _c("gc_reclaimed", "Pages reclaimed by L3's LRU GC to make room (index entry deleted, slot freed).", fork=True),
    _c("write_errors", "Page writes that failed (EIO, ENOSPC, failed fdatasync, unknown commit outcome).", fork=True),
    # ---- new beside them
    _g("inflight_spill_limit", "The configured cap on spill inflight pages (queues.max_inflight): at the cap, "
       "spills are dropped."),
    _g("staging_bytes", "Staging memory: in_use (pages held), allocated, peak (allocated high-water); cap "
       "(queues.staging_bytes) is deprecated: sglang:cp_l3_staging_limit_bytes.", ("state",)),
    _g("cold_start_loaded_pages", "Pages a 'load' cold start kept from before the restart (0 after a clear)."),
    _g("acked_not_durable_pages", "Pages spill acknowledged (write-behind: SGLang's batch_set answered True) and not "
       "yet durable: what a crash right now would lose (misses after the restart, never wrong bytes). Bounded by "
       "the staging cap; always 0 under ack = 'durable'."),
    _g("acked_not_durable_bytes", "Payload bytes of acked_not_durable_pages."),
    _g("acked_not_durable_oldest_seconds", "Age of the oldest acknowledged page not yet durable (0 when none): the "
       "write-behind window right now."),
    _c("spill_bytes", "Payload bytes made durable (the pages of spill_pages)."),
    _c("reload_bytes", "Payload bytes served by reload (the pages of reload_pages)."),
    _c("reload_from_staging", "Of reload_pages: pages served from a staged copy, not yet durable.",
       deprecated="sglang:cp_l3_reload_from_staging_pages_total"),
    _c("reload_misses", "Pages asked of reload and not served (absent, corrupt, unreadable or a refused "
       "destination)."),
    _c("corrupt_pages", "Pages whose blob failed verification on reload (checksum, header, another page or "
       "deployment): a miss, and the entry is reclaimed."),
    _c("dropped_writes", "Pages spill did not take: staging (staging bytes or max inflight full), pool_full (no "
       "slot the GC could free), bad_input (malformed key or page).", ("reason",),
       deprecated="sglang:cp_l3_dropped_pages_total"),
    _c("dedup_pages", "Pages accepted by spill without a write (already durable or staged)."),
    _c("freed_pages", "Pages removed by free() (SGLang's eviction of L3 entries)."),
    _c("index_errors", "Index operations refused: full (LMDB map full: puts refused, pages not stored), io (write "
       "transactions the file system refused, e.g. a full disk: pages not stored, reclaims retried later), damage "
       "(scans that found malformed keys or values).", ("reason",)),
    _g("write_path_failing", "1 while a write path fails (a full or failing disk): slab (page writes) or index "
       "(index commits); 0 once it works again. Each change is logged once (and at most once a minute while it "
       "lasts).", ("path",)),
    _c("index_stale_readers_cleared", "LMDB reader slots of dead processes cleared by this store."),
    _g("index_repaired", "1 when this process's open found the node's index file damaged (bit rot, a torn or "
       "truncated file) and replaced it: the damaged file moved aside, a new index of every entry that could be "
       "proven (index.on_damage); the error log line says where it went and how many entries were kept."),
    _c("reload_bad_destination", "Reload pages refused before any I/O: the destination cannot take the page in place."),
    _c("data_path_errors", "Unexpected exceptions in the store's data path, turned into misses or dropped writes."),
    _c("backend_rejected", "Pages or transfers the HiCache backend refused before the store: bad_indices (pages), "
       "unknown_pool (transfers), not_ready (pages asked before the attach or after the close).", ("reason",)),
    _c("backend_errors", "Backend calls that raised and were turned into misses or dropped writes."),
    _c("backend_not_owned_pages", "Under CP: pages SGLang handed this replica for backup that another rank of the node "
       "owns; acknowledged without a write (their owner writes them). Its share of all handed pages shows the "
       "spread."),
    # ---- Prometheus' naming rules: unit words, constants in one _info metric, only the identity labels
    _new("counter", "dropped_pages", "Pages spill did not take: staging (staging bytes or max inflight full), "
         "pool_full (no slot the GC could free), bad_input (malformed key or page).", ("reason",)),
    _new("counter", "reload_from_staging_pages", "Of reload_pages: pages served from a staged copy, not yet "
         "durable."),
    _new("gauge", "staging_limit_bytes", "The staging cap (queues.staging_bytes): staging_bytes{state=\"in_use\"} "
         "at it drops spills."),
    _new("histogram", "spill_latency_seconds", "One page, from spill() accepting it to durable (its slab "
         "fdatasync'ed and its index entry committed)."),
    _new("histogram", "reload_latency_seconds", "One reload call, from its keys to verified bytes in host memory."),
    _new("histogram", "fdatasync_latency_seconds", "One slab's fdatasync in a commit."),
    _new("histogram", "index_commit_latency_seconds", "One index write transaction (LMDB, synced)."),
    _new("gauge", "info", "1 per L3 process; its labels are the facts constant for the process.", INFO_LABELS),
    MetricSpec("sglang:glm_ext_build_info", "gauge", "1; the plugin's and SGLang's versions as labels.",
               ("version", "sglang_version"), base=()),
)
SPECS: dict[str, MetricSpec] = {m.name: m for m in METRICS}

Sample = tuple  # (name, ((label, value), ...), value)


def store_samples(st: Mapping) -> list[Sample]:
    """The store's ``stats()`` as samples. Pure: no prometheus_client, no I/O. A key the store lacks is no sample."""
    out: list[Sample] = []

    def put(short, value, typ="gauge", **labels):
        if value is None:
            return
        name = f"sglang:cp_l3_{short}" + ("_total" if typ == "counter" else "")
        out.append((name, tuple(sorted(labels.items())), float(value)))

    for kind, s in (st.get("slots") or {}).items():
        put("used_slots", s.get("used"), payload=kind)
        put("total_slots", s.get("total"), payload=kind)
    put("inflight_spill", st.get("inflight"))
    put("inflight_reload", st.get("reload_inflight"))
    put("inflight_spill_limit", st.get("max_inflight"))
    for q, key in (("write", "write_queue_depth"), ("control", "control_queue_depth"), ("touch", "pending_touches")):
        put("queue_depth", st.get(key), queue=q)
    for state, key in (("in_use", "staging_bytes"), ("allocated", "staging_allocated_bytes"),
                       ("peak", "staging_peak_bytes"), ("cap", "staging_cap_bytes")):
        put("staging_bytes", st.get(key), state=state)
    put("staging_limit_bytes", st.get("staging_cap_bytes"))
    put("cold_start_loaded_pages", st.get("cold_start_loaded_pages"))
    put("acked_not_durable_pages", st.get("acked_not_durable_pages"))
    put("acked_not_durable_bytes", st.get("acked_not_durable_bytes"))
    put("acked_not_durable_oldest_seconds", st.get("acked_not_durable_oldest_s"))
    for short, key in (("spill_pages", "spilled"), ("reload_pages", "reload_hits"), ("gc_reclaimed", "gc_reclaimed"),
                       ("write_errors", "write_errors"), ("spill_bytes", "spilled_bytes"),
                       ("reload_bytes", "reload_bytes"), ("reload_from_staging", "reload_from_staging"),
                       ("reload_from_staging_pages", "reload_from_staging"),
                       ("reload_misses", "reload_misses"), ("corrupt_pages", "verify_failures"),
                       ("dedup_pages", "dedup"), ("freed_pages", "freed"),
                       ("index_stale_readers_cleared", "index_stale_readers_cleared"),
                       ("reload_bad_destination", "reload_bad_dst"), ("data_path_errors", "data_path_errors")):
        put(short, st.get(key), "counter")
    for reason, key in (("staging", "dropped_staging"), ("pool_full", "dropped_pool_full"),
                        ("bad_input", "dropped_bad_input")):
        put("dropped_writes", st.get(key), "counter", reason=reason)
        put("dropped_pages", st.get(key), "counter", reason=reason)
    put("index_errors", st.get("index_full"), "counter", reason="full")
    put("index_errors", st.get("index_write_errors"), "counter", reason="io")
    failing = st.get("write_path_failing")
    if failing is not None:
        for path in ("slab", "index"):
            put("write_path_failing", int(path in failing), path=path)
    put("index_errors", st.get("index_damage_seen"), "counter", reason="damage")
    put("index_repaired", st.get("index_repaired"))
    for kind, h in (st.get("latency") or {}).items():  # cumulative bucket counts: the pusher observes the growth
        if kind in latency.KINDS and h:
            out.append((f"sglang:cp_l3_{kind}_latency_seconds", (), h))
    return out


def backend_samples(c: Mapping) -> list[Sample]:
    """One HiCache backend's counters (``L3HiCacheStorage.l3_stats()["backend"]``) as samples."""
    out: list[Sample] = []
    for reason in ("bad_indices", "unknown_pool", "not_ready"):
        if c.get(reason) is not None:
            out.append(("sglang:cp_l3_backend_rejected_total", (("reason", reason),), float(c[reason])))
    if c.get("errors") is not None:
        out.append(("sglang:cp_l3_backend_errors_total", (), float(c["errors"])))
    if c.get("set_not_owned") is not None:
        out.append(("sglang:cp_l3_backend_not_owned_pages_total", (), float(c["set_not_owned"])))
    return out


# ---------------------------------------------------------------------------------------------- process registry
_LOCK = threading.RLock()         # sources, families, pushes
_FAMILIES: dict[str, object] = {}  # name -> prometheus_client metric: created once per process
_LABELNAMES: tuple[str, ...] = ()  # BASE_LABELS + extra labels, fixed by the first registration
_SOURCES: dict[tuple, "_Source"] = {}
_THREAD: "threading.Thread | None" = None
_WAKE = threading.Event()
_OWNER_IDS = itertools.count(1)  # not id(owner): an id is reused once its object is gone
_warned: set[str] = set()
_VERSIONS: tuple = ()  # (label, value) of sglang:glm_ext_build_info, read once with the families


def _warn_once(what: str, msg: str, *args) -> None:
    if what not in _warned:
        _warned.add(what)
        log.warning(msg, *args)


def _families(labels: Mapping[str, str]) -> dict:
    """The metric families, created at the first call of the process with BASE_LABELS + ``labels``' other keys."""
    global _LABELNAMES, _VERSIONS
    if not _FAMILIES:
        from prometheus_client import Counter, Gauge, Histogram

        extra = tuple(k for k in labels if k not in BASE_LABELS)
        made = {}
        for m in METRICS:
            names = m.base + (extra if m.base else ()) + m.labels  # build info: no process labels, no extra ones
            if not m.base:
                made[m.name] = _build_info_family(Gauge, m)
            elif m.type == "counter":
                made[m.name] = Counter(m.name, m.doc, labelnames=names)
            elif m.type == "histogram":
                made[m.name] = Histogram(m.name, m.doc, labelnames=names, buckets=latency.BUCKETS_S)
            else:
                made[m.name] = Gauge(m.name, m.doc, labelnames=names, multiprocess_mode="mostrecent")
        _FAMILIES.update(made)
        _LABELNAMES = BASE_LABELS + extra
        _VERSIONS = _versions()
    return _FAMILIES


def _build_info_family(Gauge, m: MetricSpec):
    try:
        return Gauge(m.name, m.doc, labelnames=m.labels, multiprocess_mode="mostrecent")
    except ValueError:  # registered first by MegaMoE's counters in this process (megamoe/miss.py): the same one
        from prometheus_client import REGISTRY

        return REGISTRY._names_to_collectors[m.name]


def _versions() -> tuple[tuple[str, str], ...]:
    from importlib import metadata

    def version(dist):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "unknown"

    return (("sglang_version", version("sglang")), ("version", version("sglang-glm-ext")))


def _add_observations(child, deltas: list[int], dsum: float) -> None:
    """Add bucket counts to a histogram child. prometheus_client observes one value at a time and the engine keeps
    counts, not values: add to its per-bucket values (non-cumulative, +Inf last) where the client has them."""
    buckets, total = getattr(child, "_buckets", None), getattr(child, "_sum", None)
    if buckets is not None and total is not None and len(buckets) == len(deltas):
        for b, d in zip(buckets, deltas):
            if d:
                b.inc(d)
        total.inc(dsum)
        return
    _warn_once("histogram", "L3 metrics: this prometheus_client keeps histograms differently; latencies are "
               "observed at their bucket's bound (sums approximate)")
    for bound, d in zip(latency.BUCKETS_S + (latency.BUCKETS_S[-1],), deltas):
        for _ in range(d):
            child.observe(bound)


def _project(labels: Mapping[str, str]) -> dict[str, str]:
    """``labels`` on the process's label names: a missing one is '', one the families lack is dropped (warned once).
    The families cannot change their label names once registered (SGLang keeps its storage collector's the same
    way, storage_attachment.py)."""
    unknown = sorted(set(labels) - set(_LABELNAMES))
    if unknown:
        _warn_once("labels", "L3 metrics: labels %s are not on the metrics registered first in this process "
                   "(%s); dropped", unknown, list(_LABELNAMES))
    return {k: str(labels.get(k, "")) for k in _LABELNAMES}


@dataclass
class _Owner:
    store_stats: Callable[[], Mapping]          # the store's stats()
    store_token: object                          # the store's identity: its counters' baseline
    backend_stats: Callable[[], Mapping] | None  # a backend's counters, or None


class _Source:
    """One label set: the owners attached under it (they share one store; each has its own backend counters) and
    the last cumulative total pushed per (store or owner, metric, labels)."""

    def __init__(self, labels: dict[str, str]):
        self.labels = labels
        self.owners: dict[int, _Owner] = {}
        self.last: dict[tuple, float] = {}

    def push(self, fams: dict) -> None:
        owners = list(self.owners.items())
        if not owners:
            return
        first = owners[0][1]
        facts = [("sglang:cp_l3_info", tuple((k, self.labels[k]) for k in INFO_LABELS), 1.0),
                 ("sglang:glm_ext_build_info", _VERSIONS, 1.0)]
        self._emit(fams, 0, facts)
        self._emit(fams, id(first.store_token), store_samples(first.store_stats()))
        for oid, o in owners:
            if o.backend_stats is not None:
                self._emit(fams, oid, backend_samples(o.backend_stats()))

    def _emit(self, fams: dict, token: int, rows: Iterable[Sample]) -> None:
        extra = _LABELNAMES[len(BASE_LABELS):]
        for name, lbl, value in rows:
            spec = SPECS.get(name)
            if spec is None:
                continue
            names = spec.base + (extra if spec.base else ())
            child = fams[name].labels(**{k: self.labels[k] for k in names}, **dict(lbl))
            if spec.type == "gauge":
                child.set(value)
                continue
            key = (token, name, lbl)
            if spec.type == "histogram":
                self._observe(child, key, value)
                continue
            last = self.last.get(key, 0.0)
            # A total below the last one is a new store's count from 0 (closed and opened again): all of it is new.
            delta = value - last if value >= last else value
            if delta > 0:
                child.inc(delta)
            self.last[key] = value

    def _observe(self, child, key: tuple, h: Mapping) -> None:
        counts, total = [int(c) for c in h["counts"]], float(h["sum"])
        last, last_sum = self.last.get(key, ((), 0.0))
        if len(last) != len(counts) or any(c < b for c, b in zip(counts, last)):
            last, last_sum = [0] * len(counts), 0.0  # a new store's counts from 0: all of them are new
        deltas = [c - b for c, b in zip(counts, last)]
        if any(deltas):
            _add_observations(child, deltas, total - last_sum)
        self.last[key] = (counts, total)

    def forget(self, token: int) -> None:
        for key in [k for k in self.last if k[0] == token]:
            del self.last[key]


class Registration:
    """What :func:`register` hands back: close it once at detach (a final push, then the owner leaves)."""

    def __init__(self, key: tuple, oid: int):
        self._key, self._oid, self._closed = key, oid, False

    @property
    def labels(self) -> dict[str, str]:
        return dict(_SOURCES[self._key].labels) if self._key in _SOURCES else {}

    def push(self) -> None:
        """Push this source now (tests; the thread does it every PUSH_INTERVAL_S)."""
        with _LOCK:
            src = _SOURCES.get(self._key)
            if src is not None:
                _push_one(src)

    def close(self) -> None:
        with _LOCK:
            if self._closed:
                return
            self._closed = True
            src = _SOURCES.get(self._key)
            if src is None or self._oid not in src.owners:
                return
            _push_one(src)  # the last counts of this owner reach Prometheus before it leaves
            owner = src.owners.pop(self._oid)
            src.forget(self._oid)
            if all(o.store_token is not owner.store_token for o in src.owners.values()):
                src.forget(id(owner.store_token))
            # The source (and its label set's last gauge values) stays: a re-attach under the same labels reuses it.


def register(owner: object, labels: Mapping[str, object], store_stats: Callable[[], Mapping], store_token: object,
             backend_stats: Callable[[], Mapping] | None = None) -> "Registration | None":
    """Start pushing ``store_stats()`` (and ``backend_stats()``) under ``labels`` for ``owner`` (the attaching
    backend: each registration is one owner, however often an owner registers); None if prometheus_client cannot be
    imported (metrics off, warned once: serving goes on). ``store_token``: the store object itself (owners of one
    label set and one store share its counters' baseline; it is held until the registration closes)."""
    labels = {k: str(v) for k, v in labels.items()}
    with _LOCK:
        try:
            fams = _families(labels)
        except ImportError as e:
            _warn_once("import", "L3 metrics off: prometheus_client is not importable (%s)", e)
            return None
        projected = _project(labels)
        key = tuple(projected[k] for k in _LABELNAMES)
        src = _SOURCES.get(key)
        if src is None:
            src = _SOURCES[key] = _Source(projected)
        oid = next(_OWNER_IDS)
        src.owners[oid] = _Owner(store_stats, store_token, backend_stats)
        _push_one(src, fams)
        _ensure_thread()
        return Registration(key, oid)


def _push_one(src: _Source, fams: dict | None = None) -> None:
    try:
        src.push(fams or _FAMILIES)
    except Exception as e:  # noqa: BLE001 - a metrics failure never reaches the store's callers
        _warn_once(f"push:{type(e).__name__}", "L3 metrics push failed (%s: %s); retried next interval",
                   type(e).__name__, e)


def push_all() -> None:
    """Push every source once (the thread's body; tests call it to skip the wait)."""
    with _LOCK:
        for src in list(_SOURCES.values()):
            _push_one(src)


def registered_sources() -> dict[tuple, int]:
    """Label values -> owners attached (diagnostics and tests)."""
    with _LOCK:
        return {k: len(s.owners) for k, s in _SOURCES.items()}


def _ensure_thread() -> None:
    global _THREAD
    if _THREAD is not None and _THREAD.is_alive():
        return
    _THREAD = threading.Thread(target=_run, name="sglang-glm-ext-l3-metrics", daemon=True)
    _THREAD.start()


def _run() -> None:
    while True:
        _WAKE.wait(PUSH_INTERVAL_S)
        _WAKE.clear()
        with _LOCK:
            if not any(s.owners for s in _SOURCES.values()):
                global _THREAD
                _THREAD = None
                return
        push_all()

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
    """The label set of one attach's L3 samples (where each value comes from: docs_internal/l3_metrics.md, "Labels")."""
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


def attach(backend) -> "Registration | None":
    """Register the backend's store (and counters) with the process's L3 metrics; None when metrics are off.
    Called once the store is open (on_host_pools_registered). Never raises: metrics never fail an attach."""
    if not enabled(backend.storage_config):
        return None
    try:
        store = backend.store
        labels = metric_labels(backend.storage_config, l3_rank=backend.rank, deployment=backend.config.deployment_id,
                               cp_rank=getattr(backend, "cp_rank", None), cp_size=getattr(backend, "cp_size", None))
        own = register(backend, labels, store.stats, store.shared, backend_stats=backend.c.as_dict)
        # A host-dedup source writes other ranks' stores too: each is exported under its own rank's labels (that
        # rank's process, a peer, exports no L3 series), so the node's series count every page once.
        others = [register(st, {**labels, "tp_rank": tp, "l3_rank": st.rank}, st.stats, st.shared)
                  for tp, st in getattr(backend, "other_writer_stores", lambda: ())()]
        return own if not others or own is None else _Registrations([own, *[r for r in others if r is not None]])
    except Exception:  # noqa: BLE001
        log.exception("sglang-glm-ext L3: metrics registration failed; serving goes on without L3 metrics")
        return None


class _Registrations:
    """The registrations of one attach that writes several stores (a host-dedup source): the first is its own."""

    def __init__(self, regs: list):
        self.regs = regs

    @property
    def labels(self) -> dict[str, str]:
        return self.regs[0].labels

    def push(self) -> None:
        for r in self.regs:
            r.push()

    def close(self) -> None:
        for r in self.regs:
            r.close()


def detach(registration) -> None:
    """The final push of this attach's counts, then it leaves (its store must still be open). Never raises."""
    if registration is None:
        return
    try:
        registration.close()
    except Exception:  # noqa: BLE001
        log.exception("sglang-glm-ext L3: metrics detach failed")


# ---------------------------------------------------------------------------------------------- the reference
_LABEL_SETS = {BASE_LABELS: "rank labels", IDENTITY_LABELS: "identity labels", (): "-"}
_MARK = "<!-- generated by python -m sglang_glm_ext.l3.hicache.metrics --reference: {} -->"


def reference() -> str:
    """The L3 part of docs/metrics.md: one row per metric of METRICS, then what is deprecated."""
    rows = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    for m in METRICS:
        labels = " + ".join(x for x in (_LABEL_SETS[m.base], ", ".join(m.labels)) if x not in ("-", "")) or "-"
        mark = " (fork)" if m.fork else " (deprecated)" if m.deprecated else ""
        rows.append(f"| `{m.name}`{mark} | {m.type} | {labels} | {m.doc} |")
    rows += ["", f"Deprecated (exported by every 0.1.x release, removed in {DEPRECATED_UNTIL}):", ""]
    rows += [f"- `{m.name}`: use `{m.deprecated}`." for m in METRICS if m.deprecated]
    rows.append('- `sglang:cp_l3_staging_bytes{state="cap"}`: use `sglang:cp_l3_staging_limit_bytes`.')
    return "\n".join(rows) + "\n"


def write_section(text: str, section: str, doc: str) -> str:
    """``doc`` with the text between ``section``'s two markers replaced by ``text``."""
    begin, end = _MARK.format(f"{section} begin"), _MARK.format(f"{section} end")
    head, rest = doc.split(begin, 1)
    return head + begin + "\n" + text + end + rest.split(end, 1)[1]


def _main(argv: list[str]) -> int:
    if argv[:1] != ["--reference"] or len(argv) != 2:
        print("usage: python -m sglang_glm_ext.l3.hicache.metrics --reference docs/metrics.md", file=sys.stderr)
        return 2
    with open(argv[1], encoding="utf-8") as f:
        doc = f.read()
    with open(argv[1], "w", encoding="utf-8") as f:
        f.write(write_section(reference(), "l3", doc))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
