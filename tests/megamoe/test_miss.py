"""miss.py in one process: the world-1 path (ep = 1: served locally, no collective), the routing map, the byte
count, and the miss counters (Prometheus `sglang:` counters and a bounded-rate log). The multi-rank behaviour:
test_miss_collectives.py and test_miss_path.py."""

from __future__ import annotations

import logging

import torch

from sglang_glm_ext.megamoe import miss


def test_world_one_is_served_locally_without_collectives():
    x = torch.randn(5, 8)
    ids = torch.tensor([[0, 1]] * 5, dtype=torch.int32)
    w = torch.ones(5, 2)
    seen = {}

    def local(gx, gi, gw):
        seen.update(x=gx, ids=gi)
        return gx * 2

    plans = []
    y = miss.gathered_moe(x, ids, w, group=None, local_experts=local, shared=lambda: torch.ones(5, 8),
                          on_plan=plans.append)
    assert torch.equal(y, x * 2 + 1) and seen["x"] is x and plans == [miss.MissPlan((5,), 0)]
    empty = miss.gathered_moe(x[:0], ids[:0], w[:0], group=None, local_experts=lambda gx, gi, gw: gx,
                              shared=lambda: (_ for _ in ()).throw(AssertionError("no rows: no shared expert")))
    assert empty.shape == (0, 8)


def test_local_routing_maps_other_ranks_and_dropped_ids_out():
    ids = torch.tensor([[0, 5], [3, -1], [7, 4]], dtype=torch.int32)
    assert miss.local_routing(ids, rank=1, num_local=4).tolist() == [[-1, 1], [-1, -1], [3, 0]]
    assert miss.local_routing(ids, rank=0, num_local=4).tolist() == [[0, -1], [3, -1], [-1, -1]]


def test_comm_bytes_of_one_miss():
    # GLM-4.5 at EP 8, 10000 tokens per rank, bf16, top-8: rows out to 7 peers, 7 peers' partials back
    plan = miss.MissPlan((10000,) * 8, 3)
    assert miss.comm_bytes(plan, 5120, 8) == 10000 * 7 * (5120 * 2 + 8 * 8) + 70000 * 5120 * 2
    assert miss.comm_bytes(miss.MissPlan((9,), 0), 5120, 8) == 0  # ep = 1


def test_counters_count_per_kind_and_reason_log_at_a_bounded_rate(caplog):
    c = miss.MissCounters(log_every_s=60)
    with caplog.at_level(logging.INFO, logger="sglang_glm_ext"):
        c.count("glm4", "over_cap", 100, now=0.0)
        c.count("glm4", "over_cap", 50, now=10.0)  # within the minute: counted, not logged
        c.count("glm5", "not_ready", 7, now=10.0)
        c.count("glm4", "over_cap", 1, now=61.0)
    assert c.snapshot() == {"glm4/over_cap": {"batches": 3, "tokens": 151},
                            "glm5/not_ready": {"batches": 1, "tokens": 7}}
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 3 and "3 layer forwards, 151 tokens" in logged[-1]


def test_prometheus_counters_beside_sglangs():
    from prometheus_client import REGISTRY

    c = miss.MissCounters()
    assert c.attach_prometheus() and miss.MissCounters().attach_prometheus()  # a second attach shares the family
    before = REGISTRY.get_sample_value("sglang:megamoe_miss_tokens_total",
                                       {"layer_kind": "glm4", "reason": "over_cap"}) or 0.0
    c.count("glm4", "over_cap", 65)
    after = REGISTRY.get_sample_value("sglang:megamoe_miss_tokens_total", {"layer_kind": "glm4", "reason": "over_cap"})
    assert after == before + 65
    assert REGISTRY.get_sample_value("sglang:megamoe_miss_layer_batches_total",
                                     {"layer_kind": "glm4", "reason": "over_cap"}) >= 1
