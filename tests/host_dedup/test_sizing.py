"""host_dedup/sizing.py: what a launch's MLA/DSA host pools come to per node, dedup on and off, as SGLang sizes them."""

from sglang_glm_ext.host_dedup.sizing import glm5, node_sizing

GLM5 = glm5("auto")


def test_glm5_page_is_the_page_the_l3_store_holds():
    # l3_design.md's index sizing: target KV 3,274,752 B and DSA indexer 658,944 B per 64-token page
    s = node_sizing(GLM5, hicache_size_gb=40)
    assert s["kv_bytes_per_token"] * 64 == 3_274_752
    assert (s["bytes_per_token"] - s["kv_bytes_per_token"]) * 64 == 658_944
    assert glm5("bfloat16").kv_row == 576 * 2 and glm5("fp4_e2m1") is None


def test_hicache_size_sizes_the_kv_pool_in_whole_pages_plus_one_and_the_indexer_rides_on_top():
    s = node_sizing(GLM5, hicache_size_gb=40)
    pages = int(40e9 // 51_168) // 64 + 1  # SGLang's HostKVCache: floor to pages, one padding page
    assert s["tokens_per_pool"] == pages * 64
    assert s["off"]["host_bytes"] == pages * 64 * 61_464 > 40e9


def test_tp8_node_pins_one_pool_under_dedup_and_holds_the_same_distinct_tokens():
    s = node_sizing(GLM5, hicache_size_gb=40, ranks_per_stage=8, replicas=8, dedup_applies=True)
    off, on = s["off"], s["on"]
    assert (off["host_pools"], on["host_pools"]) == (8, 1)
    assert off["host_bytes"] == 8 * on["host_bytes"]
    assert off["distinct_tokens"] == on["distinct_tokens"] == s["tokens_per_pool"]  # the source is not enlarged


def test_a_hit_is_read_once_per_node_under_dedup_and_once_per_replica_without():
    # issue 42's figure: a 100K-token hit on GLM-5 is 1,563 pages, 6.15 GB a copy, 49 GB on a TP8 node
    s = node_sizing(GLM5, ranks_per_stage=8, replicas=8, dedup_applies=True, hit_tokens=100_000)
    assert s["on"]["hit_disk_bytes"] == 1563 * 64 * 61_464
    assert s["off"]["hit_disk_bytes"] == 8 * s["on"]["hit_disk_bytes"]


def test_excluded_launches_and_attention_dp_groups_gain_nothing():
    excluded = node_sizing(GLM5, hicache_size_gb=10, ranks_per_stage=8, replicas=8, dedup_applies=False)
    assert excluded["on"] == excluded["off"]
    dp = node_sizing(GLM5, hicache_size_gb=10, ranks_per_stage=8, replicas=1, dedup_applies=True)
    assert dp["on"] == dp["off"] and dp["off"]["distinct_tokens"] == 8 * dp["tokens_per_pool"]


def test_a_ratio_sized_launch_has_no_token_count_before_start_but_still_a_hit_size():
    s = node_sizing(GLM5, hicache_ratio=2.0, ranks_per_stage=4, replicas=4, dedup_applies=True)
    assert s["sized_by"] == "hicache_ratio" and s["tokens_per_pool"] is None
    assert s["off"]["host_bytes"] is None and s["on"]["host_pools"] == 1
    assert s["off"]["hit_disk_bytes"] == 4 * s["on"]["hit_disk_bytes"] == 4 * 16 * 64 * 61_464


def test_pipeline_stages_split_the_layers_and_every_stage_on_the_node_reads_its_own():
    s = node_sizing(GLM5, hicache_size_gb=40, ranks_per_stage=4, stages=2, pp_size=2, replicas=4, dedup_applies=True)
    assert s["layers_per_rank"] == 39 and s["ranks_on_node"] == 8
    assert s["on"]["host_pools"] == 2 and s["off"]["host_pools"] == 8
    assert s["on"]["hit_disk_bytes"] == 16 * 64 * 61_464  # two stages of half the layers: one copy of each page


def test_the_largest_size_the_guard_admits_grows_by_the_replicas_under_dedup():
    from sglang_glm_ext.host_dedup.sizing import RESERVE_BYTES

    avail = 2000 * 10**9
    s = node_sizing(glm5("fp8_e4m3"), hicache_size_gb=40, ranks_per_stage=8, replicas=8, dedup_applies=True,
                    available_bytes=avail)
    share_off, share_on = (avail - RESERVE_BYTES) // 8, avail - RESERVE_BYTES
    per_gb = s["bytes_per_token"] / s["kv_bytes_per_token"] * 1e9  # host bytes a --hicache-size GB pins (KV + indexer)
    for row, share in ((s["off"], share_off), (s["on"], share_on)):
        g = row["largest_hicache_size_gb"]
        assert g * per_gb <= share < (g + 0.1) * per_gb
    assert 7.9 < s["on"]["largest_hicache_size_gb"] / s["off"]["largest_hicache_size_gb"] < 8.1
    excluded = node_sizing(glm5(), hicache_size_gb=40, ranks_per_stage=8, replicas=8, dedup_applies=False,
                           available_bytes=avail)
    assert excluded["on"]["largest_hicache_size_gb"] == excluded["off"]["largest_hicache_size_gb"]
    assert node_sizing(glm5(), ranks_per_stage=8, replicas=8)["on"]["largest_hicache_size_gb"] is None
