"""l3/hicache/metrics.py: the mapping from ``stats()`` to samples, the fork's names, and the process registry's promises
(one registration per process, counters fed by deltas and never dropping, a failed stats() never escaping)."""

import numpy as np
import pytest

import l3kit
from l3kit import K
from sglang_glm_ext.l3.engine import latency
from sglang_glm_ext.l3.hicache import metrics
from sglang_glm_ext.l3.disk.format import slot_bytes_for

PB = 4096 + 100
SLOT = slot_bytes_for(PB)
NS = l3kit.NS  # the store fixture's namespace

FORK = {"sglang:cp_l3_used_slots", "sglang:cp_l3_total_slots", "sglang:cp_l3_inflight_spill",
        "sglang:cp_l3_inflight_reload", "sglang:cp_l3_queue_depth", "sglang:cp_l3_spill_pages_total",
        "sglang:cp_l3_reload_pages_total", "sglang:cp_l3_gc_reclaimed_total", "sglang:cp_l3_write_errors_total"}


def cfg(tmp_path):
    return l3kit.config(tmp_path, budget=16 * SLOT, map_size=64 * 2**20,
                        queues={"staging_bytes": 8 * SLOT, "write_batch_pages": 4, "io_threads": 1,
                                "reload_threads": 1})


def _labels(**over):
    base = {k: "0" for k in metrics.BASE_LABELS}
    base.update(deployment="unit", **over)
    return base


def _value(name, **labels):
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value(name, labels)


def test_the_forks_names_are_kept_and_every_name_is_in_sglangs_namespace():
    names = {m.name for m in metrics.METRICS}
    assert FORK <= names and {m.name for m in metrics.METRICS if m.fork} == FORK
    assert all(n.startswith("sglang:cp_l3_") for n in names - {"sglang:glm_ext_build_info"})
    assert len(names) == len(metrics.METRICS)
    assert all(m.name.endswith("_total") == (m.type == "counter") for m in metrics.METRICS)
    # every series a dashboard already reads keeps the labels it groups by
    assert all(m.base == metrics.BASE_LABELS for m in metrics.METRICS if m.fork)


def test_metrics_added_after_the_fork_follow_prometheus_naming():
    """A unit word ends every new name, the new series carry no constant label (those are on the one _info
    metric), and every deprecated name names a replacement that exists."""
    new = [m for m in metrics.METRICS if m.base != metrics.BASE_LABELS]
    assert {m.name for m in new} >= {"sglang:cp_l3_dropped_pages_total", "sglang:cp_l3_staging_limit_bytes",
                                     "sglang:cp_l3_reload_from_staging_pages_total", "sglang:cp_l3_info",
                                     "sglang:glm_ext_build_info"}
    for m in new:
        unit = m.name.removesuffix("_total").rsplit("_", 1)[1]
        assert unit in {"pages", "bytes", "seconds", "info"}, m.name
        assert not {"pp_size", "attn_cp_size", "cp_size", "cp_rank"} & set(m.base), m.name
    assert {m.type for m in new if m.name.endswith("_latency_seconds")} == {"histogram"}
    assert {m.name.split("cp_l3_")[1] for m in new if m.type == "histogram"} == \
        {f"{k}_latency_seconds" for k in ("spill", "reload", "fdatasync", "index_commit")}
    assert set(metrics.INFO_LABELS) == {"deployment", "pp_size", "attn_cp_size", "cp_size"}
    deprecated = {m.name: m.deprecated for m in metrics.METRICS if m.deprecated}
    assert deprecated == {"sglang:cp_l3_dropped_writes_total": "sglang:cp_l3_dropped_pages_total",
                          "sglang:cp_l3_reload_from_staging_total": "sglang:cp_l3_reload_from_staging_pages_total"}


def test_a_real_stores_stats_feed_every_store_metric(store):
    """Every store metric METRICS declares comes out of a real store's stats() after a spill and a reload, and the
    counters those drove moved: a stats() key renamed in the store is a missing sample, not a silent 0."""
    key, absent = l3kit.key(0, "p"), l3kit.key(1, "p")
    assert store.spill(K, [key], [np.zeros(PB, np.uint8)]) == [True]
    assert store.flush(30)
    assert store.reload_into(K, [key, absent], [np.ones(PB, np.uint8), np.ones(PB, np.uint8)]) == [True, False]
    rows = metrics.store_samples(store.stats())
    got = {name for name, _, _ in rows}
    # Not from stats(): the backend's counters, the two info metrics (from the labels and the versions) and, until
    # stats() carries "latency", the histograms (test_latency_histograms_come_from_stats_latency).
    want = {m.name for m in metrics.METRICS if not m.name.startswith("sglang:cp_l3_backend_")
            and m.name not in ("sglang:cp_l3_info", "sglang:glm_ext_build_info")
            and (m.type != "histogram" or "latency" in store.stats())}
    assert got == want, want ^ got  # a stats() key renamed in the store is a missing metric here
    by = {(n, lab): v for n, lab, v in rows}
    assert by[("sglang:cp_l3_used_slots", (("payload", "target_kv"),))] == 1
    assert by[("sglang:cp_l3_spill_bytes_total", ())] == PB
    assert by[("sglang:cp_l3_spill_pages_total", ())] == 1
    assert by[("sglang:cp_l3_reload_pages_total", ())] == 1 and by[("sglang:cp_l3_reload_bytes_total", ())] == PB
    assert by[("sglang:cp_l3_reload_misses_total", ())] == 1
    assert by[("sglang:cp_l3_queue_depth", (("queue", "write"),))] == 0
    for old_name, new_name in (("dropped_writes", "dropped_pages"), ("reload_from_staging",
                                                                      "reload_from_staging_pages")):
        old_rows = {lab: v for n, lab, v in rows if n == f"sglang:cp_l3_{old_name}_total"}
        assert old_rows == {lab: v for n, lab, v in rows if n == f"sglang:cp_l3_{new_name}_total"}
    assert set(old_rows) == {()}
    assert {lab for n, lab, _ in rows if n == "sglang:cp_l3_dropped_pages_total"} == \
        {(("reason", r),) for r in ("staging", "pool_full", "bad_input")}
    assert by[("sglang:cp_l3_staging_limit_bytes", ())] == by[("sglang:cp_l3_staging_bytes", (("state", "cap"),))]
    assert by[("sglang:cp_l3_staging_limit_bytes", ())] == 8 * SLOT


def test_latency_histograms_come_from_stats_latency():
    lat = latency.Latencies()
    lat.spill.observe(0.002)
    rows = metrics.store_samples({"latency": {**lat.snapshot(), "not_a_kind": {"counts": [1], "sum": 1.0}}})
    assert {n for n, _, _ in rows} == {f"sglang:cp_l3_{k}_latency_seconds" for k in latency.KINDS}
    spill = next(v for n, _, v in rows if n == "sglang:cp_l3_spill_latency_seconds")
    assert spill["sum"] == 0.002 and sum(spill["counts"]) == 1


def test_backend_counters_map_by_reason():
    rows = metrics.backend_samples({"bad_indices": 3, "unknown_pool": 1, "not_ready": 2, "errors": 4, "set_pages": 9,
                                  "set_not_owned": 5})
    assert sorted(rows) == sorted([("sglang:cp_l3_backend_rejected_total", (("reason", "bad_indices"),), 3.0),
                                   ("sglang:cp_l3_backend_rejected_total", (("reason", "unknown_pool"),), 1.0),
                                   ("sglang:cp_l3_backend_rejected_total", (("reason", "not_ready"),), 2.0),
                                   ("sglang:cp_l3_backend_errors_total", (), 4.0),
                                   ("sglang:cp_l3_backend_not_owned_pages_total", (), 5.0)])


class _FakeStore:
    def __init__(self):
        self.st = {"slots": {"target_kv": {"used": 0, "total": 8}}, "spilled": 0, "inflight": 0}
        self.fail = False

    def stats(self):
        if self.fail:
            raise RuntimeError("stats broke")
        return dict(self.st)


def test_counters_are_fed_by_deltas_and_never_drop_across_a_new_store():
    owner, s1 = object(), _FakeStore()
    lab = _labels(tp_rank="71")
    reg = metrics.register(owner, lab, s1.stats, s1, backend_stats=lambda: {"errors": 1})
    spill = "sglang:cp_l3_spill_pages_total"
    assert _value(spill, **lab) == 0
    s1.st["spilled"] = 5
    reg.push()
    reg.push()  # the same total twice is one increment, not two
    assert _value(spill, **lab) == 5
    s1.st["slots"] = {"target_kv": {"used": 3, "total": 8}}
    reg.push()
    assert _value("sglang:cp_l3_used_slots", payload="target_kv", **lab) == 3
    assert _value("sglang:cp_l3_backend_errors_total", **lab) == 1
    reg.close()
    reg.close()  # once
    # Re-attach under the same labels: a new store counting from 0 again; the Prometheus counter goes on.
    s2 = _FakeStore()
    reg2 = metrics.register(object(), lab, s2.stats, s2, backend_stats=lambda: {"errors": 1})
    assert metrics.registered_sources()[tuple(lab[k] for k in metrics.BASE_LABELS)] == 1
    assert _value(spill, **lab) == 5
    s2.st["spilled"] = 2
    reg2.push()
    assert _value(spill, **lab) == 7
    assert _value("sglang:cp_l3_backend_errors_total", **lab) == 2  # a new backend's own count adds
    # A total below the last one (the store restarted between two pushes) is all new, never a decrease.
    s2.st["spilled"] = 1
    reg2.push()
    assert _value(spill, **lab) == 8
    reg2.close()


def test_a_failing_stats_is_swallowed_and_counted_on_next_time():
    s = _FakeStore()
    lab = _labels(tp_rank="72")
    reg = metrics.register(object(), lab, s.stats, s)
    s.fail = True
    reg.push()  # never raises into the caller (the push thread, a detach)
    s.fail, s.st["spilled"] = False, 4
    metrics.push_all()
    assert _value("sglang:cp_l3_spill_pages_total", **lab) == 4
    reg.close()


def test_registering_again_never_registers_a_metric_twice_and_unknown_labels_are_dropped():
    from prometheus_client import REGISTRY

    s = _FakeStore()
    regs = [metrics.register(object(), _labels(tp_rank="73"), s.stats, s) for _ in range(3)]
    regs.append(metrics.register(object(), {**_labels(tp_rank="74"), "not_a_label_here": "x"}, s.stats, s))
    assert all(r is not None for r in regs)
    names = [n for n in REGISTRY._names_to_collectors if n == "sglang:cp_l3_spill_pages"]
    assert names == ["sglang:cp_l3_spill_pages"]
    assert metrics.registered_sources()[tuple(_labels(tp_rank="73")[k] for k in metrics.BASE_LABELS)] == 3
    assert "not_a_label_here" not in regs[-1].labels
    for r in regs:
        r.close()


def test_no_prometheus_import_at_module_import():
    import subprocess
    import sys

    code = "import sys, sglang_glm_ext.l3.hicache.metrics, sglang_glm_ext.l3.engine.store; print('prometheus_client' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"  # SGLang sets PROMETHEUS_MULTIPROC_DIR before the client's first import


@pytest.mark.parametrize("stats", [{}, {"slots": None}, {"slots": {"target_kv": {}}}])
def test_missing_keys_are_no_samples_not_errors(stats):
    assert metrics.store_samples(stats) == []


def test_a_dedup_source_exports_each_store_it_writes_under_that_ranks_labels():
    from types import SimpleNamespace

    own, other = _FakeStore(), _FakeStore()
    own.rank, other.rank = 0, 1
    own.shared, other.shared = own, other
    sc = SimpleNamespace(enable_storage_metrics=True, tp_rank=80, attn_cp_rank=0, attn_cp_size=2)
    backend = SimpleNamespace(storage_config=sc, store=own, rank=0, config=SimpleNamespace(deployment_id="unit"),
                              cp_rank=0, cp_size=2, c=SimpleNamespace(as_dict=lambda: {"errors": 0}),
                              other_writer_stores=lambda: [(81, other)])
    reg = metrics.attach(backend)
    own.st["spilled"], other.st["spilled"] = 3, 5
    reg.push()
    spill = "sglang:cp_l3_spill_pages_total"
    assert reg.labels["tp_rank"] == "80" and reg.labels["l3_rank"] == "0"
    assert _value(spill, **reg.labels) == 3
    assert _value(spill, **{**reg.labels, "tp_rank": "81", "l3_rank": "1"}) == 5
    reg.close()
