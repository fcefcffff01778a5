"""L3 metrics through SGLang's own metrics endpoint, on SGLang's real HiCache stack with the L3 backend (CPU).

A scheduler-like child process runs the stack with ``--enable-metrics`` (``StackSpec.metrics``) and Prometheus
multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``, as ``set_prometheus_multiproc_dir`` sets it up); this test process
plays SGLang's HTTP server: it mounts ``/metrics`` with SGLang's ``add_prometheus_middleware`` over the same
directory and scrapes it between the child's steps. Each metric must move as the run does: spill -> the spill
counters, reload -> the reload counters, clear -> no counter moves, detach + re-attach -> one source, no second
registration, counters never drop. A child of its own also keeps SGLang's collectors out of this process's registry.
"""

import json
import os
import subprocess
import sys

import pytest

import l3kit
from l3kit import write_config

ROOT = str(l3kit.REPO)

CHILD = r'''
import json, sys
cfg = sys.argv[1]
import sglang_glm_ext
sglang_glm_ext.register()
from sglang_glm_ext.l3.hicache import metrics
from sglang_glm_ext.l3.demo import cpu_standins, stack

PS = 64

def stage(name, **facts):
    st.backend._metrics.push()
    print("STAGE " + json.dumps({"stage": name, "sources": list(metrics.registered_sources().values()), **facts}),
          flush=True)
    assert sys.stdin.readline().strip() == "go"

def write(tokens, seed):
    st.fill_device(st.insert(tokens), seed)
    st.write_back_storage(tokens)
    assert st.backend.store.flush(30)

cpu_standins.install()
spec = stack.StackSpec(metrics=True)
sa = stack.publish_server_args(spec, storage_backend=None, extra_config='{"prefetch_threshold": 64}',
                               plugin_values={"enable_cp_l3": True, "cp_l3_config": cfg})
st = stack.DsaStack.build(spec, sa)
b = st.backend
stage("attached", kv=b.plan.kv.page_bytes, idx=b.plan.pools["indexer"].page_bytes,
      max_inflight=b.config.max_inflight)
tokens = list(range(1, 1 + 6 * PS))
write(tokens, 1)
stage("spilled")
st.evict_device(len(tokens))
st.evict_host(len(tokens))
assert st.prefetch(tokens, "r1") == len(tokens)
stage("reloaded")
assert b.clear()
stage("cleared")
ec = sa.hicache_storage_backend_extra_config
assert st.cache.detach_storage_backend()[0]
assert st.cache.attach_storage_backend("dynamic", ec if isinstance(ec, str) else json.dumps(ec))[0]
assert st.backend is not b and st.backend._metrics is not None
stage("reattached")
write(list(range(10_000, 10_000 + 2 * PS)), 2)
stage("spilled_again")
st.close()
print("DONE", flush=True)
'''


def _scrape(app_client):
    from prometheus_client.parser import text_string_to_metric_families

    r = app_client.get("/metrics/")
    assert r.status_code == 200, r.text
    out = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            if s.name.startswith("sglang:cp_l3_"):
                out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def _v(scrape, name, **labels):
    """The sum over the label sets that match ``labels`` (one source here)."""
    rows = [v for lab, v in scrape.get(name, []) if all(lab.get(k) == str(x) for k, x in labels.items())]
    assert rows, f"{name} {labels} not scraped; have {sorted(scrape)}"
    return sum(rows)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_metrics_move_with_a_hicache_run_scraped_through_sglangs_endpoint_in_multiprocess_mode(tmp_path, monkeypatch):
    from fastapi import FastAPI
    from starlette.testclient import TestClient

    import prometheus_client  # noqa: F401
    from sglang.srt.utils.common import add_prometheus_middleware

    # prometheus_client picks its value store at its first import: imported before the variable is set, this process
    # (which only reads the directory) keeps in-process values, and a test after this one can still make a metric
    # once the variable is gone again.
    prom = tmp_path / "prom"
    prom.mkdir()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(prom))
    app = FastAPI()
    add_prometheus_middleware(app)  # SGLang's /metrics: a MultiProcessCollector over PROMETHEUS_MULTIPROC_DIR
    client = TestClient(app)

    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PROMETHEUS_MULTIPROC_DIR=str(prom))
    child = subprocess.Popen([sys.executable, "-c", CHILD, write_config(tmp_path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    seen = {}
    try:
        def next_stage():
            for line in child.stdout:
                if line.startswith("STAGE "):
                    facts = json.loads(line[6:])
                    seen[facts["stage"]] = facts
                    return facts, _scrape(client)
            raise AssertionError(f"child ended early: {child.wait()} {child.stderr.read()[-4000:]}")

        def go():
            child.stdin.write("go\n")
            child.stdin.flush()

        facts, m = next_stage()
        assert facts["stage"] == "attached" and facts["sources"] == [1]
        kv, idx = facts["kv"], facts["idx"]
        assert _v(m, "sglang:cp_l3_total_slots", payload="target_kv") > 0
        assert _v(m, "sglang:cp_l3_total_slots", payload="index_k") > 0
        assert _v(m, "sglang:cp_l3_used_slots", payload="target_kv") == 0
        assert _v(m, "sglang:cp_l3_spill_pages_total") == 0
        assert _v(m, "sglang:cp_l3_inflight_spill_limit") == facts["max_inflight"]
        # The labels SGLang's storage collector uses, the fork's cp_rank, the L3 rank and the deployment.
        lab = m["sglang:cp_l3_spill_pages_total"][0][0]
        assert {k: lab[k] for k in ("tp_rank", "dp_rank", "pp_rank", "pp_size", "attn_cp_rank", "attn_cp_size",
                                    "cp_rank", "cp_size", "l3_rank")} == \
            {"tp_rank": "0", "dp_rank": "0", "pp_rank": "0", "pp_size": "1", "attn_cp_rank": "0",
             "attn_cp_size": "1", "cp_rank": "0", "cp_size": "1", "l3_rank": "0"}
        assert lab["deployment"]
        # SGLang's own storage collector is on beside ours (same switch: --enable-metrics).
        go()

        facts, m = next_stage()
        assert facts["stage"] == "spilled"
        assert _v(m, "sglang:cp_l3_spill_pages_total") == 12  # 6 KV (v1) + 6 indexer (v2) pages
        assert _v(m, "sglang:cp_l3_spill_bytes_total") == 6 * (kv + idx)
        assert _v(m, "sglang:cp_l3_used_slots", payload="target_kv") == 6
        assert _v(m, "sglang:cp_l3_used_slots", payload="index_k") == 6
        assert _v(m, "sglang:cp_l3_inflight_spill") == 0
        assert _v(m, "sglang:cp_l3_reload_pages_total") == 0
        assert _v(m, "sglang:cp_l3_write_errors_total") == 0
        go()

        facts, m = next_stage()
        assert facts["stage"] == "reloaded"
        assert _v(m, "sglang:cp_l3_reload_pages_total") == 12
        assert _v(m, "sglang:cp_l3_reload_bytes_total") == 6 * (kv + idx)
        assert _v(m, "sglang:cp_l3_corrupt_pages_total") == 0
        assert _v(m, "sglang:cp_l3_spill_pages_total") == 12
        before = m
        go()

        facts, m = next_stage()
        assert facts["stage"] == "cleared"
        assert _v(m, "sglang:cp_l3_used_slots", payload="target_kv") == 0
        for name in ("spill_pages", "spill_bytes", "reload_pages", "reload_bytes"):
            n = f"sglang:cp_l3_{name}_total"
            assert _v(m, n) == _v(before, n), n  # clear resets no counter
        go()

        facts, m = next_stage()
        assert facts["stage"] == "reattached" and facts["sources"] == [1]  # one source, one registration
        assert _v(m, "sglang:cp_l3_spill_pages_total") == 12  # a new store's counters (0) drop nothing
        assert _v(m, "sglang:cp_l3_reload_pages_total") == 12
        assert len(m["sglang:cp_l3_spill_pages_total"]) == 1
        go()

        facts, m = next_stage()
        assert facts["stage"] == "spilled_again"
        assert _v(m, "sglang:cp_l3_spill_pages_total") == 16  # counted on from the new store's 0
        assert _v(m, "sglang:cp_l3_used_slots", payload="target_kv") == 2
        go()
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err[-4000:]
        assert "DONE" in out
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    # The scheduler process is gone; its counter files stay, as SGLang's own do.
    m = _scrape(client)
    assert _v(m, "sglang:cp_l3_spill_pages_total") == 16
    assert list(seen) == ["attached", "spilled", "reloaded", "cleared", "reattached", "spilled_again"]


def test_labels_take_cp_from_the_backend_then_sglangs_storage_config_then_one_rank():
    from types import SimpleNamespace

    from sglang_glm_ext.l3.hicache.metrics import metric_labels

    sc = SimpleNamespace(tp_rank=3, dp_rank=1, pp_rank=2, pp_size=4, attn_cp_rank=5, attn_cp_size=8)
    lab = metric_labels(sc, l3_rank=11, deployment="d", extra={"cluster": "a", "tp_rank": "overwrite?"})
    assert lab == {"tp_rank": 3, "dp_rank": 1, "pp_rank": 2, "pp_size": 4, "attn_cp_rank": 5, "attn_cp_size": 8,
                   "cp_rank": 5, "cp_size": 8, "l3_rank": 11, "deployment": "d", "cluster": "a"}
    assert metric_labels(sc, l3_rank=0, deployment="d", cp_rank=2, cp_size=4, extra={})["cp_rank"] == 2
    old = SimpleNamespace(tp_rank=0, pp_rank=0, pp_size=1)  # a config without CP fields: one CP rank
    lab = metric_labels(old, l3_rank=0, deployment="d", extra={})
    assert (lab["attn_cp_rank"], lab["attn_cp_size"], lab["dp_rank"]) == (0, 1, 0)


def test_metrics_are_off_unless_sglangs_metrics_are_on():
    from types import SimpleNamespace

    from sglang_glm_ext.l3.hicache import metrics as glue

    backend = SimpleNamespace(storage_config=SimpleNamespace(enable_storage_metrics=False))
    assert glue.attach(backend) is None
    glue.detach(None)
    broken = SimpleNamespace(storage_config=SimpleNamespace(enable_storage_metrics=True))  # no store: never raises
    assert glue.attach(broken) is None
