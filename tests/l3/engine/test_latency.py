"""l3/engine/latency.py: bucket counts with Prometheus' `le` bounds, one set per store found by its index, and the
writer's and committer's recording of spill, fdatasync and index-commit latency on a real store."""

import gc
import weakref

import numpy as np

import l3kit
from l3kit import K
from sglang_glm_ext.l3.disk.format import slot_bytes_for
from sglang_glm_ext.l3.engine import latency

PB = 4096 + 100
SLOT = slot_bytes_for(PB)
NS = l3kit.NS


def cfg(tmp_path):
    return l3kit.config(tmp_path, budget=16 * SLOT, map_size=64 * 2**20,
                        queues={"staging_bytes": 8 * SLOT, "write_batch_pages": 4, "io_threads": 1,
                                "reload_threads": 1})


def test_a_value_on_a_bound_is_in_that_bucket_and_above_every_bound_in_the_last():
    h = latency.Histogram()
    for v in (0.0, latency.BUCKETS_S[0], latency.BUCKETS_S[0] * 1.01, 1e6):
        h.observe(v)
    snap = h.snapshot()
    assert len(snap["counts"]) == len(latency.BUCKETS_S) + 1
    assert snap["counts"][0] == 2 and snap["counts"][1] == 1 and snap["counts"][-1] == 1
    assert snap["sum"] == 1e6 + latency.BUCKETS_S[0] * 2.01
    h.since(0.0)  # a record never stamped is no observation
    assert sum(h.snapshot()["counts"]) == 4


def test_one_set_per_owner_gone_with_it_and_never_raising():
    class Owner:
        pass

    a, b = Owner(), Owner()
    assert latency.of(a) is latency.of(a) and latency.of(a) is not latency.of(b)
    latency.of(a).reload.observe(0.01)
    assert sum(latency.of(a).snapshot()["reload"]["counts"]) == 1
    held = weakref.ref(latency.of(a))
    del a
    gc.collect()
    assert held() is None  # the store's histograms go with its index
    assert isinstance(latency.of([]), latency.Latencies)  # unhashable: recorded nowhere, never an error


def test_a_spill_records_its_latency_its_fdatasync_and_its_index_commit(store):
    before = latency.of(store.index).snapshot()
    assert store.spill(K, [l3kit.key(0, "p")], [np.zeros(PB, np.uint8)]) == [True]
    assert store.flush(30)
    after = latency.of(store.index).snapshot()
    for kind in ("spill", "fdatasync", "index_commit"):
        assert sum(after[kind]["counts"]) > sum(before[kind]["counts"]), kind
        assert after[kind]["sum"] > before[kind]["sum"], kind
    assert sum(after["spill"]["counts"]) - sum(before["spill"]["counts"]) == 1  # one page made durable
