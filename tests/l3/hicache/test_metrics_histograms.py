"""l3/hicache/metrics.py's metrics beside the fork's: the latency histograms fed by the push thread from the engine's
counts (also in SGLang's multiprocess mode), the new series' identity labels, the _info and build-info metrics."""

import json
import subprocess
import sys

from sglang_glm_ext.l3.engine import latency
from sglang_glm_ext.l3.hicache import metrics


def _labels(**over):
    return {**{k: "0" for k in metrics.BASE_LABELS}, "deployment": "unit", **over}


def _identity(labels):
    return {k: labels[k] for k in metrics.IDENTITY_LABELS}


def _value(name, **labels):
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value(name, labels)


class _Store:
    def __init__(self):
        self.lat = latency.Latencies()
        self.st = {"dropped_staging": 0}

    def stats(self):
        return {**self.st, "latency": self.lat.snapshot()}


def test_histograms_take_the_engines_counts_as_observations_and_never_drop():
    lab = _labels(tp_rank="81")
    ident = _identity(lab)
    s = _Store()
    reg = metrics.register(object(), lab, s.stats, s)
    name = "sglang:cp_l3_fdatasync_latency_seconds"
    s.lat.fdatasync.observe(0.003)
    s.lat.fdatasync.observe(0.004)
    s.lat.fdatasync.observe(30.0)
    reg.push()
    reg.push()  # the same counts twice are observed once
    assert _value(f"{name}_count", **ident) == 3
    assert _value(f"{name}_bucket", le="0.0025", **ident) == 0
    assert _value(f"{name}_bucket", le="0.005", **ident) == 2
    assert _value(f"{name}_bucket", le="10.0", **ident) == 2
    assert _value(f"{name}_bucket", le="+Inf", **ident) == 3
    assert abs(_value(f"{name}_sum", **ident) - 30.007) < 1e-9
    # A store opened again counts from 0: its counts are all new, the histogram never goes down.
    s.lat = latency.Latencies()
    s.lat.fdatasync.observe(0.0001)
    reg.push()
    assert _value(f"{name}_count", **ident) == 4
    assert _value(f"{name}_bucket", le="0.0005", **ident) == 1
    reg.close()


def test_new_series_carry_the_identity_labels_and_the_constants_are_on_the_info_metric():
    lab = _labels(tp_rank="82", pp_size="2", attn_cp_size="4", cp_size="4", deployment="d1")
    s = _Store()
    s.st["dropped_staging"] = 3
    reg = metrics.register(object(), lab, s.stats, s)
    assert _value("sglang:cp_l3_dropped_pages_total", reason="staging", **_identity(lab)) == 3
    assert _value("sglang:cp_l3_dropped_writes_total", reason="staging", **lab) == 3  # deprecated, still there
    assert _value("sglang:cp_l3_info", deployment="d1", pp_size="2", attn_cp_size="4", cp_size="4",
                  **_identity(lab)) == 1
    from importlib import metadata

    assert _value("sglang:glm_ext_build_info", version=metadata.version("sglang-glm-ext"),
                  sglang_version=metadata.version("sglang")) == 1
    reg.close()


_CHILD = """
import json, sys
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector
from sglang_glm_ext.l3.engine import latency
from sglang_glm_ext.l3.hicache import metrics

lat = latency.Latencies()
for v in (0.02, 0.02, 3.0):
    lat.spill.observe(v)
class S:
    def stats(self):
        return {"latency": lat.snapshot()}
s = S()
labels = {k: "0" for k in metrics.BASE_LABELS}
reg = metrics.register(object(), labels, s.stats, s)
reg.close()
r = CollectorRegistry()
MultiProcessCollector(r)
ident = {k: "0" for k in metrics.IDENTITY_LABELS}
n = "sglang:cp_l3_spill_latency_seconds"
print(json.dumps([r.get_sample_value(n + "_count", ident), r.get_sample_value(n + "_bucket", {**ident, "le": "0.025"}),
                  r.get_sample_value(n + "_sum", ident)]))
"""


def test_histograms_reach_a_multiprocess_scrape(tmp_path):
    """SGLang's /metrics is a MultiProcessCollector over per-process files: the histograms the push thread fills
    must be in them."""
    import os

    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, check=True).stdout
    count, le_25ms, total = json.loads(out.strip().splitlines()[-1])
    assert (count, le_25ms) == (3, 2) and abs(total - 3.04) < 1e-9
