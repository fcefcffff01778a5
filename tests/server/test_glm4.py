"""GLM-4.x (Glm4MoeForCausalLM: MHA KV pool) through the real server with HiCache + L3: L3 hits after a restart
and the same greedy ids as the first pass. The page_first host layout with kernel I/O runs here (the GLM-5
scenarios use layer_first with direct I/O), so the MHA kernel-I/O copies are exercised through SGLang's pools."""

import pytest

from sglang_glm_ext.cpu_serve import run, served, tiny_model

from .conftest import PAGE, fsck, l3_config, send_all, start, workload

pytestmark = [pytest.mark.server, pytest.mark.timeout(1200)]

ARGS = ("--enable-hierarchical-cache", "--hicache-ratio", "2", "--hicache-io-backend", "kernel",
        "--hicache-mem-layout", "page_first", "--hicache-write-policy", "write_through",
        "--hicache-storage-prefetch-policy", "wait_complete", "--enable-metrics", "--enable-cp-l3")


def test_glm4_moe_l3_hits_after_restart(tmp_path):
    model = str(tmp_path / "glm4")
    tiny_model.write("glm4_moe", model)
    cfg = l3_config(str(tmp_path / "l3"))
    reqs = workload(2, 2, seed=3)
    srv = start(model, str(tmp_path / "first.log"), (*ARGS, "--cp-l3-config", cfg))
    try:
        first = send_all(srv, reqs)
        spilled = served.wait_counter_settled(srv.url, run.SPILL)
    finally:
        srv.stop()
    assert spilled > 0
    srv = start(model, str(tmp_path / "restart.log"), (*ARGS, "--cp-l3-config", cfg))
    try:
        replay = send_all(srv, reqs)
        reloaded = served.wait_counter_settled(srv.url, run.RELOAD)  # the L3 metrics are published periodically
    finally:
        srv.stop()
    stored = (first[0].prompt_tokens + len(first[0].output_ids) - 1) // PAGE * PAGE
    assert replay[0].cached == {"device": 0, "host": 0,
                                "storage": min(stored, (replay[0].prompt_tokens - 1) // PAGE * PAGE)}
    assert reloaded == sum(r.cached["storage"] for r in replay) // PAGE  # one MHA pool: one page per hit page
    assert [r.output_ids for r in replay] == [r.output_ids for r in first]
    assert fsck(cfg)["rc"] == 0
