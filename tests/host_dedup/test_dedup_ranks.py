"""Host dedup on 2 and 4 gloo processes playing one node's attention-CP ranks, with SGLang's real HiCache stack,
controllers and pools and the L3 backend (driver: ``sglang_glm_ext/l3/demo/dedup_ranks.py``, one OS process per
rank, forked from a zygote as tests/l3/demo/test_cp_ranks.py does). Dedup on and off run in the same test and are
compared: host pool bytes, bytes read from L3, device KV. Every run is bounded; a hang fails the test."""

import json
import time

import pytest

PS = 64
RUN_TIMEOUT = 400  # s per multi-process run on a loaded 2-core machine (a hang guard, not a speed target)

pytestmark = pytest.mark.slow


def _config(d, ranks):
    from sglang_glm_ext.l3.config import example_config

    d.mkdir(parents=True)
    text = example_config(str(d)).replace('budget = "1GiB"', 'budget = "32MiB"').replace("count = 1",
                                                                                         f"count = {ranks}")
    (d / "l3.toml").write_text(text)
    return str(d / "l3.toml")


def _run(zygote, tmp_path, world, dedup, **extra):
    d = tmp_path / f"w{world}-{dedup}"
    out = d / "out"
    out.mkdir(parents=True)
    plan = {"world": world, "init_file": str(d / "gloo-init"), "config": _config(d / "l3", world), "out": str(out),
            "dedup": dedup, "pages": 8, "corrupt_page": 5, **extra}
    (d / "plan.json").write_text(json.dumps(plan))
    procs = [zygote.spawn(module="sglang_glm_ext.l3.demo.dedup_ranks", argv=[d / "plan.json", r],
                          log=out / f"log{r}") for r in range(world)]
    deadline = time.monotonic() + RUN_TIMEOUT
    try:
        for p in procs:
            p.wait(max(1.0, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    got = []
    for r in range(world):
        f = out / f"rank{r}.json"
        assert f.exists(), f"rank {r} wrote no result: {(out / f'log{r}').read_text()[-3000:]}"
        res = json.loads(f.read_text())
        assert "error" not in res, f"rank {r}: {res['error']}\n{res.get('traceback', '')}"
        got.append(res)
    return got


@pytest.mark.parametrize("world", [2, 4])
def test_one_host_copy_and_one_disk_read_per_node_with_every_rank_byte_exact(zygote, tmp_path, world):
    off = _run(zygote, tmp_path, world, "off", mismatch=False)
    on = _run(zygote, tmp_path, world, "on")
    one_copy = off[0]["host_pool_bytes"]
    assert one_copy > 0 and all(g["host_pool_bytes"] == one_copy and g["role"] == "off" for g in off)
    assert on[0]["role"] == "source" and on[0]["host_pool_bytes"] == one_copy
    assert all(g["role"] == "peer" and g["host_pool_bytes"] == 0 for g in on[1:])
    assert all(g["l3_stats_dedup"]["group"] == list(range(world)) for g in on)

    # write-back, eviction, L3 prefetch and load-back on every rank; every rank's device KV is the bytes written
    for g in off + on:
        assert g["loaded_hits"] == 8 * PS and g["bytes_ok_hits"], g
    # disk: one copy read per node with dedup, one per rank without (the engine's count and the kernel's)
    page_bytes = off[0]["l3_read_bytes_hits"]
    assert page_bytes > 0 and all(g["l3_read_bytes_hits"] == page_bytes for g in off)
    assert sum(g["l3_read_bytes_hits"] for g in on) == page_bytes
    assert all(g["l3_read_bytes_hits"] == 0 for g in on[1:])
    proc_off, proc_on = (sum(g["proc_read_bytes_hits"] for g in x) for x in (off, on))
    if proc_off:  # 0 only where the kernel does not count the reads (tmpfs): the engine's count stands alone
        assert proc_on <= 1.1 * proc_off / world
    # the peers got their KV from the source's broadcast, layer by layer
    assert all(g["counters"]["broadcast_layers"] >= 2 * 2 for g in on)
    # the source wrote every page once, each into its owner's store (every rank's slabs and disk share, as off)
    stores = on[0]["writer_stores"]
    assert sorted(stores) == [str(r) for r in range(world)] and all(g["writer_stores"] is None for g in on[1:])
    spilled = [s["spilled"] for s in stores.values()]  # 2 rounds x 8 pages x 2 kinds (KV, DSA indexer); fixed keys
    assert sum(spilled) == 2 * 8 * 2 and all(n > 0 for n in spilled), stores


def test_a_peer_whose_load_plan_differs_and_a_corrupt_page_are_misses_on_every_rank(zygote, tmp_path):
    got = _run(zygote, tmp_path, 2, "on")
    for g in got:
        # rank 1's plan digest differs: neither rank loads (SGLang's load-back miss), neither hangs
        assert g["loaded_mismatch_prefetch"] == 8 * PS
        assert g["mismatch_device_tokens"] == 0 and g["mismatch_counted"] == 1
        # the source's copy of page 5 rots: its verify fails, the completion MIN cuts every rank at page 5
        assert g["loaded_corrupt"] == 5 * PS and g["bytes_ok_corrupt"]
